"""JSON Schema ``pattern`` / ``format`` -> a deterministic automaton over Unicode code points.

Constrained decoding feeds a string's characters one code point at a time and must never enter a
state from which the string can no longer become valid, so this compiles a pattern to a minimal DFA
with its dead states removed:

    a = compile_pattern("^[a-z]+(?:-[a-z]+)*$")
    state = a.step(a.initial, ord("x"))   # None: no string with this prefix matches
    a.accepting(state)                     # the text so far matches

A JSON Schema ``pattern`` is an ECMA-262 regular expression that must match *somewhere* in the
string, so the automaton recognizes ``.*P.*`` (``.`` here: any code point); a ``^`` at the start of a
top-level alternative removes its leading ``.*``, a ``$`` at its end the trailing one. ``$`` matches
only at the very end (no multiline flag). Characters are code points, as with ECMA's ``u`` flag;
surrogate code points (U+D800-U+DFFF) never match, so no state is ever entered on one.

Supported: literals; ``.`` (not \\n \\r U+2028 U+2029); ``\\d \\D \\w \\W \\s \\S`` with ECMA's
ASCII-only ``\\d``/``\\w`` and Unicode ``\\s``; ``\\t \\n \\v \\f \\r \\0 \\cX \\xHH \\uHHHH``
(surrogate pairs joined), ``\\u{H...}``, escaped ASCII punctuation; classes ``[...]`` / ``[^...]``
with ranges and class escapes; groups ``(...)``, ``(?:...)``, ``(?<name>...)``; ``|``; quantifiers
``* + ? {n} {n,} {n,m}`` and their lazy forms (same language). As in ECMA's web-compatibility
grammar, a ``{`` that does not start a quantifier and a lone ``]`` or ``}`` are literals.

Refused with ``PatternError(unsupported=True)``: backreferences, lookaround, ``\\b``/``\\B``,
``\\p{...}``, group modifiers, ``^``/``$`` anywhere but the ends of a top-level alternative, unknown
letter escapes, class escapes as range ends, and patterns whose NFA would exceed ``MAX_NFA_STATES``,
whose DFA would exceed ``MAX_STATES`` states or whose subset construction would visit more than
``MAX_WORK`` NFA states, a bound a schema's patterns share (so no schema's take much over 0.3 s here). Malformed patterns (unbalanced parentheses,
``{3,1}``, nothing to repeat, ``[z-a]``, bad escapes) and patterns matching no string at all raise it
with ``unsupported=False``. The automaton is immutable once built and safe to share between threads.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from itertools import groupby, pairwise

from engine.json_regex_syntax import ANY, Node, PatternError, Ranges, _has_anchor, _Parser, _trim

__all__ = ["MAX_STATES", "CharAutomaton", "PatternError", "WorkBudget", "compile_pattern", "merged_edges"]

MAX_STATES = 2000  # DFA states (before minimization): bounds compile time and memory
MAX_NFA_STATES = 10_000  # counted repetitions copy their body; this bounds the copies
MAX_WORK = 300_000  # per schema: NFA states visited by subset construction (~1 us each here), and the rest below
STATE_WORK = 30  # what minimizing and pruning cost per DFA state, in those units (measured: ~30 us a state)


class WorkBudget:
    """What subset construction may still visit: one per schema, shared by its patterns (found by
    QA: twenty patterns each within a per-pattern bound took 34 s to compile together)."""

    def __init__(self, left: int = MAX_WORK) -> None:
        self.left = left

    def spend(self, work: int, what: str) -> None:
        self.left -= work
        if self.left < 0:
            raise PatternError(f"pattern is too complex to compile ({what}; a schema's patterns share one "
                               "bound)", unsupported=True)

Edge = tuple[int, int, int]  # (first code point, last code point, target state)


class _Nfa:
    """Thompson NFA: per state, character edges (Ranges, target) and epsilon edges."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[Ranges, int]]] = []
        self.eps: list[list[int]] = []

    def state(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise PatternError(f"pattern needs more than {MAX_NFA_STATES} NFA states", unsupported=True)
        self.edges.append([])
        self.eps.append([])
        return len(self.eps) - 1

    def then(self, e: int, node: Node) -> int:
        """Build ``node`` to follow state e; its end state."""
        a, b = self.build(node)
        self.eps[e].append(a)
        return b

    def build(self, node: Node) -> tuple[int, int]:
        s = e = self.state()
        if node[0] == "set":
            e = self.state()
            if node[1]:
                self.edges[s].append((node[1], e))
        elif node[0] == "alt" and len(node[1]) > 1:
            e = self.state()
            for item in node[1]:
                self.eps[self.then(s, item)].append(e)
        elif node[0] != "rep":  # a cat, or an alt of one
            for item in node[1]:
                e = self.then(e, item)
        else:
            _, body, lo, hi = node
            for _ in range(lo):  # every copy adds states, so state() bounds even {0,99999999}
                e = self.then(e, body)
            exits = []
            for _ in range(hi - lo if hi is not None else 1):
                exits.append(e)
                e = self.then(e, body)
            if hi is None:
                self.eps[e].append(exits[0])
            f = self.state()
            for x in [*exits, e]:
                self.eps[x].append(f)
            e = f
        return s, e


def merged_edges(edges: Iterable[Edge]) -> list[Edge]:
    """Ascending edges with adjacent ranges to the same target joined (one behaviour, one form)."""
    out: list[Edge] = []
    for lo, hi, t in edges:
        if out and out[-1][2] == t and out[-1][1] == lo - 1:
            out[-1] = (out[-1][0], hi, t)
        else:
            out.append((lo, hi, t))
    return out


def _determinize(nfa: _Nfa, start: int, final: int, univ: int,
                 budget: WorkBudget) -> tuple[list[bool], list[list[Edge]]]:
    important = [bool(nfa.edges[q]) or q == final for q in range(len(nfa.eps))]

    def closure(seeds: Iterable[int]) -> frozenset[int]:
        seen = set(seeds)
        stack = list(seen)
        while stack:
            for r in nfa.eps[stack.pop()]:
                if r not in seen:
                    seen.add(r)
                    stack.append(r)
        budget.spend(len(seen), "subset construction")
        if univ in seen:  # accepts every continuation: all such sets are one state
            return frozenset((univ,))
        return frozenset(q for q in seen if important[q])

    ids: dict[frozenset[int], int] = {}
    sets: list[frozenset[int]] = []

    def intern(key: frozenset[int]) -> int:
        if key not in ids:
            if len(sets) >= MAX_STATES:
                raise PatternError(f"pattern needs more than {MAX_STATES} DFA states", unsupported=True)
            ids[key] = len(sets)
            sets.append(key)
        return ids[key]

    intern(closure([start]))
    by_targets: dict[frozenset[int], int] = {}
    table: list[list[Edge]] = []
    while len(table) < len(sets):
        # sweep the range boundaries of this state's NFA edges: the code-point space splits into
        # intervals with a constant set of NFA targets, never walked code point by code point
        events = sorted((p, t, d) for q in sets[len(table)] for ranges, t in nfa.edges[q]
                        for lo, hi in ranges for p, d in ((lo, 1), (hi + 1, -1)))
        active: dict[int, int] = {}
        cuts: list[tuple[int, int | None]] = []
        for p, group in groupby(events, key=lambda ev: ev[0]):
            for _, t, d in group:
                active[t] = active.get(t, 0) + d
                if not active[t]:
                    del active[t]
            if (key := frozenset(active)) and key not in by_targets:
                by_targets[key] = intern(closure(key))
            cuts.append((p, by_targets[key] if key else None))
        table.append(merged_edges((p, q - 1, t) for (p, t), (q, _) in pairwise(cuts) if t is not None))
    return [final in s or univ in s for s in sets], table


def _prune(accept: list[bool], table: list[list[Edge]]) -> tuple[list[bool], list[list[Edge]]]:
    """Keep the states that can still reach acceptance, renumbered (0 stays the initial state)."""
    preds: list[list[int]] = [[] for _ in table]
    for s, out in enumerate(table):
        for _, _, t in out:
            preds[t].append(s)
    live = {s for s, a in enumerate(accept) if a}
    stack = list(live)
    while stack:
        for p in preds[stack.pop()]:
            if p not in live:
                live.add(p)
                stack.append(p)
    if 0 not in live:
        raise PatternError("pattern matches no string")
    order = sorted(live)
    new = {s: i for i, s in enumerate(order)}
    return ([accept[s] for s in order],
            [[(lo, hi, new[t]) for lo, hi, t in table[s] if t in live] for s in order])


def _minimize(accept: list[bool], table: list[list[Edge]]) -> tuple[list[bool], list[list[Edge]]]:
    """Hopcroft's partition refinement over the intervals cut by all edges' boundaries. Missing edges
    lead to an implicit dead state; all states here are live, so it is a block of its own that never
    needs to be a splitter, and only real edges are indexed."""
    points = sorted({p for out in table for lo, hi, _ in out for p in (lo, hi + 1)})
    index = {p: i for i, p in enumerate(points)}
    inv: list[dict[int, list[int]]] = [{} for _ in table]  # target -> interval -> sources
    for s, out in enumerate(table):
        for lo, hi, t in out:
            for a in range(index[lo], index[hi + 1]):
                inv[t].setdefault(a, []).append(s)
    block = [int(not a) for a in accept]
    members = [{s for s, b in enumerate(block) if b == k} for k in (0, 1)]
    work = [0, 1]
    while work:
        by_interval: dict[int, set[int]] = {}
        for t in list(members[work.pop()]):
            for a, sources in inv[t].items():
                by_interval.setdefault(a, set()).update(sources)
        for x in by_interval.values():
            hits: dict[int, set[int]] = {}
            for s in x:
                hits.setdefault(block[s], set()).add(s)
            for y, hit in hits.items():
                if len(hit) < len(members[y]):
                    rest = members[y] - hit
                    small, members[y] = (hit, rest) if len(hit) <= len(rest) else (rest, hit)
                    for s in small:
                        block[s] = len(members)
                    work.append(len(members))  # the smaller half suffices (Hopcroft's trick)
                    members.append(small)
    order = {block[0]: 0}  # renumber in BFS order from the initial state
    queue = [block[0]]
    for b in queue:
        for _, _, t in table[next(iter(members[b]))]:
            if block[t] not in order:
                order[block[t]] = len(order)
                queue.append(block[t])
    reps = [next(iter(members[b])) for b in queue]
    return [accept[r] for r in reps], [merged_edges((lo, hi, order[block[t]]) for lo, hi, t in table[r]) for r in reps]


class CharAutomaton:
    """A DFA over code points whose every state can still reach acceptance; immutable."""

    __slots__ = ("_accepting", "_starts", "_ends", "_targets")

    def __init__(self, accepting: list[bool], table: list[list[Edge]]) -> None:
        object.__setattr__(self, "_accepting", tuple(accepting))
        object.__setattr__(self, "_starts", tuple(tuple(e[0] for e in out) for out in table))
        object.__setattr__(self, "_ends", tuple(tuple(e[1] for e in out) for out in table))
        object.__setattr__(self, "_targets", tuple(tuple(e[2] for e in out) for out in table))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CharAutomaton is immutable")

    @property
    def initial(self) -> int:
        return 0

    @property
    def size(self) -> int:
        return len(self._accepting)

    def step(self, state: int, cp: int) -> int | None:
        i = bisect_right(self._starts[state], cp) - 1
        if i < 0 or cp > self._ends[state][i]:
            return None
        return self._targets[state][i]

    def accepting(self, state: int) -> bool:
        return self._accepting[state]

    def transitions(self, state: int) -> tuple[Edge, ...]:
        """``state``'s edges: (first code point, last code point, next state), ascending and disjoint."""
        return tuple(zip(self._starts[state], self._ends[state], self._targets[state], strict=True))


def compile_pattern(source: str, budget: WorkBudget | None = None) -> CharAutomaton:
    """Compile a JSON Schema ``pattern`` (search semantics) to a CharAutomaton, within ``budget``
    (a fresh one of ``MAX_WORK`` when None)."""
    budget = WorkBudget() if budget is None else budget
    try:
        parser = _Parser(source)
        alts = parser.alternatives()
        if parser.peek():
            raise parser.error("unbalanced ')'")
        nfa = _Nfa()
        start, final, univ = nfa.state(), nfa.state(), nfa.state()
        nfa.edges[univ].append((ANY, univ))
        loop = None
        for items in alts:
            head = tail = False
            while items and items[0] == ("bol",):
                items, head = items[1:], True
            while items and items[-1] == ("eol",):
                items, tail = items[:-1], True
            if any(_has_anchor(n) for n in items):
                raise PatternError(f"^ or $ inside pattern {source!r}: only at the ends of a top-level "
                                   "alternative", unsupported=True)
            if not head:
                items = _trim(items)
            if not tail:
                items = _trim(items[::-1])[::-1]
            a, b = nfa.build(("cat", tuple(items)))
            if head:
                nfa.eps[start].append(a)
            else:
                if loop is None:  # the unanchored prefix, shared by all alternatives
                    loop = nfa.state()
                    nfa.edges[loop].append((ANY, loop))
                    nfa.eps[start].append(loop)
                nfa.eps[loop].append(a)
            nfa.eps[b].append(final if tail else univ)
        accept, table = _determinize(nfa, start, final, univ, budget)
        budget.spend(STATE_WORK * len(table), "its automaton's states")
    except RecursionError:
        raise PatternError(f"pattern {source!r} nests too deeply", unsupported=True) from None
    return CharAutomaton(*_minimize(*_prune(accept, table)))
