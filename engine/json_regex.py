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
``MAX_WORK`` NFA states (so no pattern compiles for much over a second). Malformed patterns (unbalanced parentheses,
``{3,1}``, nothing to repeat, ``[z-a]``, bad escapes) and patterns matching no string at all raise it
with ``unsupported=False``. The automaton is immutable once built and safe to share between threads.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from itertools import groupby, pairwise

MAX_STATES = 2000  # DFA states (before minimization): bounds compile time and memory
MAX_NFA_STATES = 10_000  # counted repetitions copy their body; this bounds the copies
MAX_WORK = 1_000_000  # NFA states visited by the subset construction: bounds its time (about a second)
MAX_CP = 0x10FFFF

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, non-adjacent, surrogate-free
Edge = tuple[int, int, int]  # (first code point, last code point, target state)


class PatternError(ValueError):
    """A pattern this module cannot compile; .unsupported True when it is valid ECMA-262 using
    what is not supported here (backreferences, lookaround, ...), False when it is malformed."""

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


def _norm(ranges: Iterable[tuple[int, int]]) -> Ranges:
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    out = []
    for lo, hi in merged:  # surrogates are cut out here so no class or `.` can ever match one
        for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)):
            if a <= b:
                out.append((a, b))
    return tuple(out)


def _negate(ranges: Ranges) -> Ranges:
    out, nxt = [], 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CP:
        out.append((nxt, MAX_CP))
    return _norm(out)


ANY = _norm([(0, MAX_CP)])
_DIGIT = _norm([(48, 57)])
_WORD = _norm([(48, 57), (65, 90), (95, 95), (97, 122)])
_SPACE = _norm([(9, 13), (32, 32), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
                (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)])
_DOT = _negate(_norm([(10, 10), (13, 13), (0x2028, 0x2029)]))
_CLASS_ESCAPES = {"d": _DIGIT, "D": _negate(_DIGIT), "w": _WORD, "W": _negate(_WORD),
                  "s": _SPACE, "S": _negate(_SPACE)}
_CONTROL = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13}
_HEX = "0123456789abcdefABCDEF"

# AST: ("set", Ranges) | ("cat", nodes) | ("alt", nodes) | ("rep", node, lo, hi|None) | ("bol",) | ("eol",)
Node = tuple
_SIMPLE = {".": ("set", _DOT), "^": ("bol",), "$": ("eol",)}


_REFUSED_ESCAPES = {"b": "word boundary assertions", "B": "word boundary assertions", "k": "named backreferences",
                    "p": "Unicode property escapes", "P": "Unicode property escapes",
                    **dict.fromkeys("123456789", "backreferences")}


class _Parser:
    def __init__(self, src: str) -> None:
        self.src, self.i, self.names = src, 0, set()

    def error(self, msg: str, unsupported: bool = False) -> PatternError:
        return PatternError(f"{msg} at offset {self.i} of pattern {self.src!r}", unsupported=unsupported)

    def peek(self, k: int = 0) -> str:
        return self.src[self.i + k] if self.i + k < len(self.src) else ""

    def alternatives(self) -> list[list[Node]]:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        return alts

    def sequence(self) -> list[Node]:
        items: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom()
            if (quant := self.quantifier()) is not None:
                if atom[0] in ("bol", "eol"):
                    raise self.error("nothing to repeat")
                atom = ("rep", atom, *quant)
            items.append(atom)
        return items

    def braces(self) -> tuple[int, int | None, int] | None:
        """``{n}``, ``{n,}`` or ``{n,m}`` here as (n, m, end); None: the ``{`` is a literal."""
        end = self.src.find("}", self.i)
        lo, comma, hi = self.src[self.i + 1:end].partition(",")
        if end < 0 or not all(x.isascii() and x.isdigit() for x in ((lo, hi) if hi else (lo,))):
            return None
        return int(lo), int(hi) if hi else None if comma else int(lo), end + 1

    def quantifier(self) -> tuple[int, int | None] | None:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{" and (b := self.braces()):
            lo, hi, self.i = b
            if hi is not None and hi < lo:
                raise self.error("numbers out of order in {} quantifier")
        else:
            return None
        self.i += self.peek() == "?"  # lazy: another match order, the same language
        return lo, hi

    def atom(self) -> Node:
        c = self.peek()
        if c in ("*", "+", "?") or (c == "{" and self.braces()):
            raise self.error("nothing to repeat")
        self.i += 1
        if c in _SIMPLE:
            return _SIMPLE[c]
        if c == "(":
            return self.group()
        if c == "[":
            return ("set", self.klass())
        x = self.escape(in_class=False) if c == "\\" else ord(c)
        return ("set", x if isinstance(x, tuple) else _norm([(x, x)]))

    def group(self) -> Node:
        head = self.src[self.i:self.i + 3] if self.peek() == "?" else ""
        if head in ("?<=", "?<!") or head.startswith(("?=", "?!")):
            raise self.error("lookaround assertions are not supported", unsupported=True)
        if head.startswith("?<"):
            end = self.src.find(">", self.i)
            name = self.src[self.i + 2:end] if end > 0 else ""
            if not name.replace("$", "_").isidentifier() or name in self.names:
                raise self.error(f"invalid or duplicate group name {name!r}")
            self.names.add(name)
            self.i = end + 1
        elif head:
            if not head.startswith("?:"):
                raise self.error("group modifiers are not supported", unsupported=True)
            self.i += 2
        alts = self.alternatives()
        if self.peek() != ")":
            raise self.error("missing ')'")
        self.i += 1
        return ("alt", tuple(("cat", tuple(a)) for a in alts))

    def klass(self) -> Ranges:
        negate = self.peek() == "^"
        self.i += negate
        items: list[tuple[int, int]] = []
        while (c := self.peek()) != "]":
            if not c:
                raise self.error("unterminated character class")
            self.i += 1
            lo = self.escape(in_class=True) if c == "\\" else ord(c)
            if self.peek() == "-" and self.peek(1) not in ("", "]"):
                self.i += 2
                hi = self.escape(in_class=True) if self.src[self.i - 1] == "\\" else ord(self.src[self.i - 1])
                if isinstance(lo, tuple) or isinstance(hi, tuple):
                    raise self.error("a class escape as a range end is not supported", unsupported=True)
                if lo > hi:
                    raise self.error("range out of order in character class")
                items.append((lo, hi))
            else:
                items.extend(lo if isinstance(lo, tuple) else [(lo, lo)])
        self.i += 1
        return _negate(_norm(items)) if negate else _norm(items)

    def hex(self, n: int) -> int:
        digits = self.src[self.i:self.i + n]
        if len(digits) != n or any(ch not in _HEX for ch in digits):
            raise self.error(f"expected {n} hex digits")
        self.i += n
        return int(digits, 16)

    def escape(self, in_class: bool) -> int | Ranges:
        """A code point, or the Ranges of a class escape."""
        if not (c := self.peek()):
            raise self.error("\\ at end of pattern")
        self.i += 1
        if c in _CLASS_ESCAPES or c in _CONTROL:
            return _CLASS_ESCAPES.get(c) or _CONTROL[c]
        if c == "b" and in_class:
            return 8
        if c == "0" and not ("0" <= self.peek() <= "9"):
            return 0
        if c in _REFUSED_ESCAPES or c == "0":
            raise self.error(f"{_REFUSED_ESCAPES.get(c, 'octal escapes')} are not supported", unsupported=True)
        if c == "c" and self.peek().isascii() and self.peek().isalpha():
            self.i += 1
            return ord(self.src[self.i - 1]) % 32
        if c == "x":
            return self.hex(2)
        if c == "u" and self.peek() == "{":
            end = self.src.find("}", self.i)
            digits = self.src[self.i + 1:end] if end > 0 else ""
            if not digits or any(ch not in _HEX for ch in digits) or int(digits, 16) > MAX_CP:
                raise self.error("invalid \\u{...} escape")
            self.i = end + 1
            return int(digits, 16)
        if c == "u":
            cp = self.hex(4)
            tail = self.src[self.i:self.i + 6]  # a UTF-16 pair spells one code point under the `u` flag
            if 0xD800 <= cp <= 0xDBFF and tail[:3].lower() == "\\ud" and all(h in _HEX for h in tail[2:]) \
                    and int(tail[2:], 16) >= 0xDC00:
                self.i += 6
                return 0x10000 + ((cp - 0xD800) << 10) + (int(tail[2:], 16) - 0xDC00)
            return cp
        if c.isascii() and not c.isalnum():
            return ord(c)
        raise self.error(f"escape \\{c} is not supported", unsupported=True)


def _nullable(node: Node) -> bool:
    if node[0] in ("cat", "alt"):
        return (all if node[0] == "cat" else any)(_nullable(n) for n in node[1])
    return node[0] != "set" and (node[0] != "rep" or node[2] == 0 or _nullable(node[1]))


def _trim(items: list[Node]) -> list[Node]:
    """Drop what an unanchored side absorbs: with ``.*`` before it, ``.*X?Y`` is ``.*Y`` and
    ``.*X{2,9}`` is ``.*X{2}`` (this keeps ``[a-z]{0,1000}x`` from costing a thousand subsets)."""
    while items and _nullable(items[0]):
        items = items[1:]
    if items and items[0][0] == "rep":
        items = [("rep", items[0][1], items[0][2], items[0][2]), *items[1:]]
    return items


def _has_anchor(node: Node) -> bool:
    if node[0] in ("cat", "alt"):
        return any(_has_anchor(n) for n in node[1])
    return node[0] in ("bol", "eol") or (node[0] == "rep" and _has_anchor(node[1]))


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


def _merged(edges: Iterable[Edge]) -> list[Edge]:
    out: list[Edge] = []
    for lo, hi, t in edges:
        if out and out[-1][2] == t and out[-1][1] == lo - 1:
            out[-1] = (out[-1][0], hi, t)
        else:
            out.append((lo, hi, t))
    return out


def _determinize(nfa: _Nfa, start: int, final: int, univ: int) -> tuple[list[bool], list[list[Edge]]]:
    important = [bool(nfa.edges[q]) or q == final for q in range(len(nfa.eps))]
    work = 0

    def closure(seeds: Iterable[int]) -> frozenset[int]:
        nonlocal work
        seen = set(seeds)
        stack = list(seen)
        while stack:
            for r in nfa.eps[stack.pop()]:
                if r not in seen:
                    seen.add(r)
                    stack.append(r)
        work += len(seen)
        if work > MAX_WORK:
            raise PatternError("pattern is too complex to compile (subset construction work)", unsupported=True)
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
        table.append(_merged((p, q - 1, t) for (p, t), (q, _) in pairwise(cuts) if t is not None))
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
    return [accept[r] for r in reps], [_merged((lo, hi, order[block[t]]) for lo, hi, t in table[r]) for r in reps]


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


def compile_pattern(source: str) -> CharAutomaton:
    """Compile a JSON Schema ``pattern`` (search semantics) to a CharAutomaton."""
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
        accept, table = _determinize(nfa, start, final, univ)
    except RecursionError:
        raise PatternError(f"pattern {source!r} nests too deeply", unsupported=True) from None
    return CharAutomaton(*_minimize(*_prune(accept, table)))


# dates and times as the common parsers take them (Python's datetime, pydantic): years 0001-9999,
# the day checked against the month and February 29 only in leap years, no leap second, at most 9
# digits of a second's fraction (a small model otherwise writes digits until its token limit)
_YEAR = r"(?:[1-9]\d{3}|0[1-9]\d{2}|00[1-9]\d|000[1-9])"
_LEAP_YEAR = r"(?:\d{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
         rf"|02-(?:0[1-9]|1\d|2[0-8]))|{_LEAP_YEAR}-02-29)")
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_SECS = r"\d+(?:\.\d+)?S"
_DUR_DATE = r"(?:\d+Y(?:\d+M)?(?:\d+D)?|\d+M(?:\d+D)?|\d+D)"
_DUR_TIME = rf"T(?:\d+H(?:\d+M)?(?:{_SECS})?|\d+M(?:{_SECS})?|{_SECS})"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"


def _ipv6() -> str:
    # RFC 3986's IPv6address, one alternative per position of the "::"
    alts = [rf"(?:{_H16}:){{6}}{_LS32}", rf"::(?:{_H16}:){{5}}{_LS32}"]
    for before, after in ((0, 4), (1, 3), (2, 2), (3, 1), (4, 0)):
        head = rf"(?:(?:{_H16}:){{0,{before}}}{_H16})?"
        alts.append(rf"{head}::(?:{_H16}:){{{after}}}{_LS32}")
    alts.append(rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}")
    alts.append(rf"(?:(?:{_H16}:){{0,6}}{_H16})?::")
    return "(?:" + "|".join(alts) + ")"


_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt ]{_TIME}",
    "duration": rf"P(?:{_DUR_DATE}(?:{_DUR_TIME})?|{_DUR_TIME}|\d+W)",
    "email": rf"[A-Za-z0-9!#$%&'*+/=?^_`{{|}}~.-]+@{_LABEL}(?:\.{_LABEL})+",
    "hostname": rf"{_LABEL}(?:\.{_LABEL})*",
    "ipv4": _IPV4,
    "ipv6": _ipv6(),
    "uuid": r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[^\s\x00-\x1f\x7f<>\"{}|\\^`]+",
}


def format_pattern(name: str) -> str | None:
    """An anchored pattern for a JSON Schema ``format``; None if unknown. Dates and times are a
    subset of RFC 3339's that Python's datetime and pydantic parse (above); ``hostname`` does not
    bound the total length to 253;
    ``email`` and ``uri`` are pragmatic, not RFC 5321 / RFC 3986 grammars; ``duration`` takes
    ISO 8601 designators in order (P1Y2M3DT4H5M6.5S, P1W), a fraction only on seconds."""
    body = _FORMATS.get(name)
    return None if body is None else f"^{body}$"
