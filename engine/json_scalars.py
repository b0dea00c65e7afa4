"""Structured outputs' bounded scalars: numbers between ``minimum`` and ``maximum`` (integers a
multiple of ``multipleOf`` too) and strings with ``minLength`` / ``maxLength`` and a ``pattern``
or ``format`` (``engine.json_regex``'s automaton), read one byte at a time by
``engine.json_schema``'s grammar.

Each check is of a prefix: a byte is allowed only when some way to finish the value still meets
every rule, so decoding never reaches a state no token can leave.

    NumberBounds.viable(text)     some number starting with ``text`` lies within the bounds
    StringRules.viable(s, n)      after ``n`` characters in automaton state ``s`` the string can end
                                  well (JSON Schema counts characters as code points; the string's
                                  bytes as characters: ``engine.json_strings``)

A bounded number is written without an exponent (every decimal in range has such a form), so
what a prefix can still become is an interval, or a union of intervals for an integer part still
growing, checked exactly with fractions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import torch

from engine.json_regex import CharAutomaton, PatternError, WorkBudget, merged_edges
from engine.json_strings import PlainTokens

Interval = tuple  # (low, low_closed, high, high_closed); None: unbounded on that side
_SURROGATES = (0xD800, 0xDFFF)
BROAD = 16  # ASCII characters a pattern state must allow for its plain tokens to be masked as tensors
LAYER_BUDGET = 250_000  # automaton states x characters of a pattern's length table (more is refused)


def _meets(a: Interval, b: Interval) -> bool:
    """Whether two non-empty intervals share a point."""
    if a[0] is None or (b[0] is not None and (b[0], not b[1]) > (a[0], not a[1])):
        low, low_closed = b[0], b[1]
    else:
        low, low_closed = a[0], a[1]
    if a[2] is None or (b[2] is not None and (b[2], b[3]) < (a[2], a[3])):
        high, high_closed = b[2], b[3]
    else:
        high, high_closed = a[2], a[3]
    if low is None or high is None:
        return True
    return low < high or (low == high and low_closed and high_closed)


@dataclass(frozen=True, slots=True)
class NumberBounds:
    """A number's range (an integer's as whole closed bounds), and an integer's ``step``: it must
    be a multiple of it (``multipleOf``; None: any)."""

    integer: bool
    range: Interval
    step: int | None = None

    @classmethod
    def of(cls, integer: bool, low: tuple[Fraction, bool] | None,
           high: tuple[Fraction, bool] | None, step: int | None = None) -> NumberBounds | None:
        """``low`` / ``high``: (the bound, exclusive); None when no value lies between them."""
        lo, lo_excl = low if low is not None else (None, False)
        hi, hi_excl = high if high is not None else (None, False)
        if integer:  # (as whole, closed bounds)
            if lo is not None:
                lo = Fraction(math.floor(lo) + 1 if lo_excl else math.ceil(lo))
            if hi is not None:
                hi = Fraction(math.ceil(hi) - 1 if hi_excl else math.floor(hi))
            lo_excl = hi_excl = False
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_excl or hi_excl))):
            return None
        if step is not None and lo is not None and hi is not None and -(-lo // step) * step > hi:
            return None  # (no multiple between them)
        return cls(integer, (lo, not lo_excl, hi, not hi_excl), step)

    def viable(self, text: bytes) -> bool:
        """Whether a number of this type starting with ``text`` (no exponent) lies in range."""
        neg = text[:1] == b"-"
        body = text[1:] if neg else text
        if not body:
            return self._meets_magnitude(Fraction(0), None, neg)
        if b"." in body:
            whole, frac = body.split(b".")
            start = Fraction(int(whole + frac or b"0"), 10 ** len(frac))
            return self._meets_magnitude(start, start + Fraction(1, 10 ** len(frac)), neg)
        if body == b"0":
            return self._meets_magnitude(Fraction(0), Fraction(1), neg)
        digits = int(body)  # more digits may follow: [d*10^k, (d+1)*10^k) for some k
        # the intervals rise with k: the first whose top passes the least magnitude in range is
        # the one that can meet it (or, for a closed end, the next), none after if it lies above
        lo, _, hi, _ = self.range
        least = (max(lo, 0) if lo is not None else 0) if not neg else (max(-hi, 0) if hi is not None else 0)
        k = max(0, len(str(int(least))) - len(str(digits + 1)) - 1)
        while (digits + 1) * 10 ** k <= least:
            k += 1
        within = any(self._meets_magnitude(Fraction(digits * 10 ** j), Fraction((digits + 1) * 10 ** j), neg, False)
                     for j in (k, k + 1))
        if self.step is None or not within:
            return within
        # (a multiple may lie only in a later, wider interval: tried until one starts past the range's
        # far end; with none, one both inside the range and as wide as the step holds a multiple)
        most = hi if not neg else (None if lo is None else -lo)
        for j in range(k, k + 2 * len(str(self.step)) + len(str(int(least))) + 2):
            if self._meets_magnitude(Fraction(digits * 10 ** j), Fraction((digits + 1) * 10 ** j), neg):
                return True
            if most is not None and digits * 10 ** j > most:
                return False
        return False  # (not reached: by then an interval lies inside the range and holds a multiple)

    def _meets_magnitude(self, start: Fraction, end: Fraction | None, neg: bool, stepped: bool = True) -> bool:
        """Whether some value of magnitude in [start, end) (end None: unbounded), negated when
        ``neg``, lies in range (a multiple of ``step`` unless not ``stepped``); an integer's
        magnitudes are the whole numbers there."""
        if self.integer:
            last = None if end is None else Fraction(-(-end // 1) - 1)
            first = Fraction(-(-start // 1))
            if last is not None and first > last:
                return False
            values = (first, True, last, True) if not neg else (
                None if last is None else -last, True, -first, True)
            if self.step is None or not stepped or not _meets(values, self.range):
                return _meets(values, self.range)
            low = max((v for v in (values[0], self.range[0]) if v is not None), default=None)
            high = min((v for v in (values[2], self.range[2]) if v is not None), default=None)
            return low is None or high is None or -(-low // self.step) * self.step <= high
        values = (start, True, end, False) if not neg else (None if end is None else -end, False, -start, True)
        return _meets(values, self.range)

    def contains(self, text: bytes) -> bool:
        value = Fraction(text.decode())
        lo, lo_closed, hi, hi_closed = self.range
        return (lo is None or value > lo or (lo_closed and value == lo)) and (
            hi is None or value < hi or (hi_closed and value == hi)) and (self.step is None or value % self.step == 0)


def _reaches(automaton: CharAutomaton) -> tuple[list[int], dict[int, list[int]]]:
    """Per state, the fewest characters to a match, and each state's predecessors."""
    preds: dict[int, list[int]] = {s: [] for s in range(automaton.size)}
    for s in range(automaton.size):
        for _, _, t in automaton.transitions(s):
            preds[t].append(s)
    dist = [-1] * automaton.size
    frontier = [s for s in range(automaton.size) if automaton.accepting(s)]
    for s in frontier:
        dist[s] = 0
    while frontier:
        nxt = []
        for t in frontier:
            for s in preds[t]:
                if dist[s] < 0:
                    dist[s] = dist[t] + 1
                    nxt.append(s)
        frontier = nxt
    return dist, preds


@dataclass(frozen=True, eq=False)
class StringRules:
    """A string's length bounds (code points) and pattern automaton (None: any text)."""

    low: int
    high: int | None
    automaton: CharAutomaton | None
    dmin: list[int] = field(default_factory=list)  # per automaton state: characters to a match, at fewest
    layers: list[int] = field(default_factory=list)  # bit s of layers[k]: a match is exactly k characters on
    universal: frozenset[int] = frozenset()  # states that match whatever follows
    _tables: dict = field(default_factory=dict)  # plain_mask's, built on its first call

    @classmethod
    def of(cls, low: int, high: int | None, automaton: CharAutomaton | None,
           budget: WorkBudget | None = None) -> StringRules | None:
        """None when no string meets them all. The length table is paid from ``budget`` (the
        schema's, shared with its patterns' compiles)."""
        if automaton is None:
            return cls(low, high, None)
        dist, preds = _reaches(automaton)
        layers: list[int] = []
        if low > 0:  # (what lengths are reachable matters only below minLength)
            cells = automaton.size * (low + automaton.size)
            if cells > LAYER_BUDGET:
                raise PatternError("this pattern with this minLength needs too large a length table", unsupported=True)
            if budget is not None:  # (measured: ~0.05 us a cell)
                budget.spend(cells // 20, "its minLength's length table")
            layer = sum(1 << s for s in range(automaton.size) if automaton.accepting(s))
            for _ in range(low + automaton.size + 1):
                layers.append(layer)
                nxt = 0
                bits, s = layer, 0
                while bits:
                    if bits & 1:
                        for p in preds[s]:
                            nxt |= 1 << p
                    bits >>= 1
                    s += 1
                layer = nxt
        universal = frozenset(s for s in range(automaton.size)
                              if automaton.accepting(s) and _covers_all(automaton.transitions(s), s))
        rules = cls(low, high, automaton, dist, layers, universal)
        return rules if rules.viable(automaton.initial, 0) else None

    def viable(self, state: int, count: int) -> bool:
        """Whether ``count`` characters in, in automaton ``state``, the string can still end within the rules."""
        high = self.high
        if high is not None and count > high:
            return False
        if self.automaton is None:
            return True
        need = self.low - count
        if need <= 0:
            return high is None or self.dmin[state] <= high - count
        size = self.automaton.size
        top = need + size if high is None else min(high - count, need + size)
        bit = 1 << state
        return any(self.layers[k] & bit for k in range(need, top + 1))

    def may_close(self, state: int, count: int) -> bool:
        return count >= self.low and (self.automaton is None or self.automaton.accepting(state))

    def next_char(self, state: int, count: int, cp: int) -> int | None:
        """The automaton's state after character ``cp`` when the string can still end well, else None."""
        if self.automaton is None:
            return state if self.viable(state, count + 1) else None
        nxt = self.automaton.step(state, cp)
        return nxt if nxt is not None and self.viable(nxt, count + 1) else None

    def some_char(self, state: int, count: int, ranges: list[tuple[int, int]]) -> bool:
        """Whether some character of ``ranges`` (surrogates aside) may come next."""
        ranges = [(a, b) for a, b in ranges if a <= b and not (_SURROGATES[0] <= a and b <= _SURROGATES[1])]
        if not ranges:
            return False
        if self.automaton is None:
            return self.viable(state, count + 1)
        for a, b, t in self.automaton.transitions(state):
            for low, high in ranges:
                x, y = max(a, low), min(b, high)
                if x <= y and not (_SURROGATES[0] <= x and y <= _SURROGATES[1]) and self.viable(t, count + 1):
                    return True
        return False

    def plain_room(self, state: int, count: int) -> int | None:
        """How many characters of plain text may come next whatever they are (None: it depends on them)."""
        if self.automaton is not None and state not in self.universal:
            return None
        return 1 << 30 if self.high is None else self.high - count

    def broad(self, state: int) -> bool:
        """Whether ``state`` lets many ASCII characters come next (16 or more), so that most of a
        vocabulary's tokens get past their first character: ``plain_mask``'s tensors then beat
        walking the tokens' trie (a few ms a mask against tens); a narrow state (digits, a few
        letters) prunes the trie at once, and the walk is the cheaper (``bench/pattern_masks.py``)."""
        key = ("broad", state)
        if key not in self._tables:
            self._tables[key] = sum(min(hi, 0x7F) - lo + 1 for lo, hi, _ in self.automaton.transitions(state)
                                    if lo <= 0x7F) >= BROAD
        return self._tables[key]

    def plain_mask(self, state: int, count: int, plain: PlainTokens) -> torch.Tensor:
        """Which of a vocabulary's plain-text tokens may come next (a bool mask over its width), all
        at once: the automaton runs over every token's characters as tensors, position by
        position, and each end state is checked as ``viable`` checks it (the states on the way
        need no check: a string that can end well from a token's end could from inside it)."""
        table, bounds, dmin, counts = self._dense()
        sink = table.shape[0] - 1
        at = torch.full((plain.ids.numel(),), state, dtype=torch.int64)
        alive = torch.arange(at.numel())  # (ascending; the tokens at least j+1 characters long come first)
        for column in plain.columns:
            cur = alive[:int(torch.searchsorted(alive, column.numel()))]
            if not cur.numel():
                break  # (every token still alive has ended)
            nxt = table[at[cur], torch.bucketize(column[cur], bounds, right=True) - 1]
            at[cur] = nxt
            if bool((nxt == sink).any()):
                alive = alive[at[alive] != sink]
        total = count + plain.lengths
        ok = at != sink
        if self.high is not None:
            ok &= (total <= self.high) & (dmin[at] <= self.high - total)
        if self.low > 0:
            below = total < self.low
            need = self.low - total[below]
            top = need + self.automaton.size if self.high is None else torch.minimum(
                self.high - total[below], need + self.automaton.size)
            s = at[below]
            top_c = top.clamp(min=0, max=counts.shape[0] - 1)
            found = counts[top_c, s] - counts[(need - 1).clamp(max=counts.shape[0] - 1), s]
            ok[below] = (at[below] != sink) & (top >= need) & (found > 0)
        mask = torch.zeros(plain.width, dtype=torch.bool)
        mask[plain.ids[ok]] = True
        return mask

    def _dense(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The automaton as a table over its alphabet's classes (a last row: the dead state), the
        classes' first code points, ``dmin`` and the layers' running counts (row k, column s: in
        how many of layers 0..k state s is), built once."""
        if "t" not in self._tables:
            a = self.automaton
            points = sorted({0} | {x for s in range(a.size) for lo, hi, _ in a.transitions(s)
                                   for x in (lo, hi + 1) if x <= 0x10FFFF})
            index = {p: i for i, p in enumerate(points)}
            table = torch.full((a.size + 1, len(points)), a.size, dtype=torch.int64)
            for s in range(a.size):
                for lo, hi, t in a.transitions(s):
                    table[s, index[lo]:index.get(hi + 1, len(points))] = t
            dmin = torch.tensor([*self.dmin, 0], dtype=torch.int64)
            rows = [[(layer >> s) & 1 for s in range(a.size)] + [0] for layer in self.layers] or [[0] * (a.size + 1)]
            counts = torch.tensor(rows, dtype=torch.int32).cumsum(0)
            self._tables.update(t=(table, torch.tensor(points, dtype=torch.int64), dmin, counts))
        return self._tables["t"]

    def state_class(self, state: int, reach: int) -> int:
        """``state``'s class among the states no string of at most ``reach`` characters tells apart
        (their matches, and what ``viable`` reads: the fewest characters to a match under a
        maxLength, the reachable lengths under a minLength), so a mask's key holds the class: the
        states a counted repetition steps through share their masks (found measuring: each
        character of ``[A-Za-z ]{10,400}`` made its masks anew, ~100 ms each)."""
        classes = self._tables.get(("classes", reach))
        if classes is None:
            a = self.automaton
            sig = [(a.accepting(s), self.dmin[s] if self.high is not None else 0,
                    tuple((layer >> s) & 1 for layer in self.layers)) for s in range(a.size)]
            classes = _relabel(sig)
            for _ in range(reach):  # (Moore's refinement, stopped at the horizon or when stable)
                sig = [(classes[s], *merged_edges((lo, hi, classes[t]) for lo, hi, t in a.transitions(s)))
                       for s in range(a.size)]
                finer = _relabel(sig)
                if max(finer, default=0) == max(classes, default=0):
                    break
                classes = finer
            self._tables[("classes", reach)] = classes
        return classes[state]

    def cache_count(self, state: int, count: int, reach: int) -> object:
        """``count`` as far as a token of at most ``reach`` characters can tell it apart."""
        room = None if self.high is None else self.high - count
        if self.automaton is None:
            return (min(max(self.low - count, 0), reach + 1), None if room is None else min(room, reach + 1))
        if count < self.low:
            return ("exact", count)
        return (0, None if room is None else min(room, reach + max(self.dmin) + 1))


def _relabel(signatures: list) -> list[int]:
    ids: dict = {}
    return [ids.setdefault(sig, len(ids)) for sig in signatures]


def _covers_all(ranges: list[tuple[int, int, int]], state: int) -> bool:
    """Whether every code point but the surrogates leads from ``state`` back to it."""
    at = 0
    for a, b, t in ranges:
        if t != state:
            continue
        if a > at and not (at >= _SURROGATES[0] and a - 1 <= _SURROGATES[1]):
            return False
        at = max(at, b + 1)
    return at > 0x10FFFF
