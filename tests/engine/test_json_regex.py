"""engine.json_regex: differential tests against Python's ``re`` (ECMA syntax rendered to Python's),
the live-state contract of ``step``, refusals, and the ``format`` patterns."""

from __future__ import annotations

import datetime
import ipaddress
import random
import re
import time
from collections import deque

import pytest

from engine.json_formats import format_pattern
from engine.json_regex import MAX_STATES, CharAutomaton, PatternError, compile_pattern

_PY_SPACE = "[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
_PY_DOT = "[^\n\r\u2028\u2029]"
# (ECMA, Python) spellings of the same atom: Python's \s \d \w and `.` differ from ECMA's
_ATOMS = [("a", "a"), ("b", "b"), ("a", "a"), ("b", "b"), ("c", "c"), (r"\.", r"\."), (".", _PY_DOT),
          (r"\d", "[0-9]"), (r"\s", _PY_SPACE), (r"\w", "[A-Za-z0-9_]"), (r"\S", f"[^{_PY_SPACE[1:-1]}]"),
          ("[ab]", "[ab]"), ("[^a]", "[^a]"), ("[a-c]", "[a-c]"), ("[^\\s\\d]", f"[^{_PY_SPACE[1:-1]}0-9]"),
          ("[-a]", "[-a]"), ("[b-]", "[b-]"), ("\\u0061", "a"), ("\\x62", "b"), ("\\n", "\\n"),
          ("\U0001F600", "\U0001F600"), ("[\U0001F600-\U0001F64F]", "[\U0001F600-\U0001F64F]")]
_ALPHABET = "ab c.1\n_\u2028\u00e9\U0001F600\U0001F64F"


def run(a: CharAutomaton, text: str) -> bool:
    state = a.initial
    for ch in text:
        state = a.step(state, ord(ch))
        if state is None:
            return False
    return a.accepting(state)


def live_states(a: CharAutomaton) -> tuple[set[int], set[int]]:
    """(states reachable from the initial one, states that can reach an accepting one)."""
    reach, queue = {a.initial}, deque([a.initial])
    preds: dict[int, set[int]] = {}
    while queue:
        s = queue.popleft()
        for _, _, t in a.transitions(s):
            preds.setdefault(t, set()).add(s)
            if t not in reach:
                reach.add(t)
                queue.append(t)
    co = {s for s in reach if a.accepting(s)}
    stack = list(co)
    while stack:
        for p in preds.get(stack.pop(), ()):
            if p not in co:
                co.add(p)
                stack.append(p)
    return reach, co


class _Gen:
    def __init__(self, rng: random.Random) -> None:
        self.rng, self.groups = rng, 0

    def alt(self, depth: int) -> tuple[str, str]:
        parts = [self.seq(depth) for _ in range(self.rng.choice((1, 1, 1, 2, 3)))]
        return "|".join(p[0] for p in parts), "|".join(p[1] for p in parts)

    def seq(self, depth: int) -> tuple[str, str]:
        parts = [self.term(depth) for _ in range(0 if self.rng.random() < 0.1 else self.rng.randint(1, 3))]
        return "".join(p[0] for p in parts), "".join(p[1] for p in parts)

    def term(self, depth: int) -> tuple[str, str]:
        rng = self.rng
        if depth > 0 and rng.random() < 0.3:
            e, p = self.alt(depth - 1)
            kind = rng.choice(("(", "(?:", "(?<"))
            if kind == "(?<":
                self.groups += 1
                e, p = f"(?<g{self.groups}>{e})", f"(?P<g{self.groups}>{p})"
            else:
                e, p = f"{kind}{e})", f"{kind}{p})"
        else:
            e, p = rng.choice(_ATOMS)
        if rng.random() < 0.4:
            n = rng.randint(0, 3)
            q = rng.choice(("*", "+", "?", f"{{{n}}}", f"{{{n},}}", f"{{{n},{n + rng.randint(0, 2)}}}"))
            q += "?" if rng.random() < 0.2 else ""
            e, p = e + q, p + q
        return e, p

    def pattern(self) -> tuple[str, str]:
        alts = []
        for _ in range(self.rng.choice((1, 1, 1, 2))):
            e, p = self.seq(2) if self.rng.random() < 0.5 else self.alt(2)
            e, p = (f"(?:{e})", f"(?:{p})") if "|" in e else (e, p)
            if self.rng.random() < 0.5:
                e, p = "^" + e, "^" + p
            if self.rng.random() < 0.5:
                e, p = e + "$", p + r"\Z"
            alts.append((e, p))
        return "|".join(a[0] for a in alts), "|".join(a[1] for a in alts)


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 8)))


def random_walk(a: CharAutomaton, rng: random.Random) -> str:
    """A text the automaton accepts: random steps, then the shortest way to acceptance."""
    dist = {s: 0 for s in range(a.size) if a.accepting(s)}
    while len(dist) < a.size:  # every state is live, so this ends
        dist.update({s: 1 + min(dist[t] for _, _, t in a.transitions(s) if t in dist) for s in range(a.size)
                     if s not in dist and any(t in dist for _, _, t in a.transitions(s))})
    state, out = a.initial, []
    while dist[state] or (a.transitions(state) and len(out) < 8 and rng.random() < 0.7):
        edges = a.transitions(state)
        if len(out) >= 8:
            edges = tuple(e for e in edges if dist[e[2]] < dist[state])
        lo, hi, state = rng.choice(edges)
        out.append(chr(rng.choice((lo, hi, rng.randint(lo, hi)))))
    return "".join(out)


def test_differential_against_re() -> None:
    rng = random.Random(20240131)
    cases = matches = too_big = 0
    for _ in range(600):
        ecma, py = _Gen(rng).pattern()
        oracle = re.compile(py)
        try:
            a = compile_pattern(ecma)
        except PatternError as e:
            if e.unsupported and "states" in str(e):  # nested counted repetitions can blow up
                too_big += 1
                continue
            assert not e.unsupported and "no string" in str(e), ecma
            assert not any(oracle.search(random_text(rng)) for _ in range(50)), ecma
            continue
        reach, co = live_states(a)
        assert reach <= co, f"dead state reachable in {ecma!r}"
        for _ in range(3):
            walked = random_walk(a, rng)
            assert run(a, walked) and oracle.search(walked), (ecma, py, walked)
        for text in [random_text(rng) for _ in range(12)]:
            expected = oracle.search(text) is not None
            assert run(a, text) == expected, (ecma, py, text)
            cases += 1
            matches += expected
            state = a.initial
            for k, ch in enumerate(text):  # None promises that no extension matches
                nxt = a.step(state, ord(ch))
                if nxt is None:
                    assert not expected
                    for _ in range(5):
                        assert not oracle.search(text[:k + 1] + random_text(rng)), (ecma, text[:k + 1])
                    break
                state = nxt
    assert cases > 6000 and 0.2 < matches / cases < 0.9 and too_big < 12


def test_matching_prefixes_never_step_to_none() -> None:
    rng = random.Random(7)
    for _ in range(300):
        ecma, py = _Gen(rng).pattern()
        try:
            a = compile_pattern(ecma)
        except PatternError:
            continue
        for _ in range(10):
            text = random_text(rng)
            if re.search(py, text):
                state = a.initial
                for ch in text:
                    state = a.step(state, ord(ch))
                    assert state is not None, (ecma, text)


@pytest.mark.parametrize(("pattern", "yes", "no"), [
    ("", ["", "x\n"], []),
    ("^$", [""], ["a", "\n"]),
    ("a$", ["ba"], ["a\n", "ab"]),
    ("^a|b$", ["ax", "xb", "b"], ["xa", "bx"]),
    ("^(?:a|b)+$", ["abba"], ["", "abc"]),
    ("^a{2,3}$", ["aa", "aaa"], ["a", "aaaa"]),
    ("^a{2}?b{0}$", ["aa"], ["aab"]),
    ("^x{0,}?$", ["", "xxx"], ["y"]),
    ("^[^a]$", ["\U0001F600", "\n"], ["a", ""]),
    ("^.$", ["\U0001F600", "\u00e9"], ["\n", "\r", "\u2028", "ab"]),
    ("^\\uD83D\\uDE00\\u{1F601}$", ["\U0001F600\U0001F601"], ["\U0001F600"]),
    ("^[\U0001F600-\U0001F64F]+$", ["\U0001F600\U0001F64F"], ["\U0001F650", "a"]),
    ("^\\s+$", [" \t\u00a0\u3000\ufeff\u2028"], ["\x1c", "\x85"]),
    ("^\\w\\d$", ["_1"], ["\u00e91", "a\u0661"]),
    ("^[\\d-]+$", ["1-2"], ["a"]),
    ("^[a-c-e]$", ["b", "-", "e"], ["d"]),
    ("^\\cJ\\0\\/\\-$", ["\n\x00/-"], []),
    ("^a{$", ["a{"], []),
    ("^a{1,x}]}$", ["a{1,x}]}"], []),
    ("^[\\b]$", ["\x08"], ["b"]),
])
def test_examples(pattern: str, yes: list[str], no: list[str]) -> None:
    a = compile_pattern(pattern)
    assert all(run(a, t) for t in yes), pattern
    assert not any(run(a, t) for t in no), pattern


def test_surrogates_and_step_fast_path() -> None:
    a = compile_pattern(".")
    assert a.step(a.initial, 0xD800) is None
    assert a.step(a.initial, 0x10FFFF) is not None
    with pytest.raises(AttributeError):
        a.size = 3  # type: ignore[misc]


@pytest.mark.parametrize(("pattern", "unsupported"), [
    ("(a)\\1", True), ("(?<n>a)\\k<n>", True), ("a(?=b)", True), ("a(?!b)", True), ("(?<=a)b", True),
    ("(?<!a)b", True), ("\\bword\\b", True), ("\\Ba", True), ("\\p{L}", True), ("\\P{L}", True),
    ("a^b", True), ("(^a)", True), ("a$b", True), ("(?i:a)", True), ("\\a", True), ("[\\d-z]", True),
    ("\\01", True), ("(a|b)*a(a|b){20}", True), ("^a{20000}$", True), ("(?:a{100}){200}", True),
    ("(a", False), ("a)", False), ("a{3,1}", False), ("*a", False), ("a**", False), ("a{2}{3}", False),
    ("+", False), ("?", False), ("{2}", False), ("[z-a]", False), ("[a", False), ("\\", False),
    ("\\x4", False), ("\\u12", False), ("\\u{110000}", False), ("(?<1a>x)", False), ("(?<a>x)(?<a>y)", False),
    ("^*", False), ("a|$+", False), ("[^\\s\\S]", False), ("^a[]b", False), ("\\uD800", False),
])
def test_refusals(pattern: str, unsupported: bool) -> None:
    with pytest.raises(PatternError) as info:
        compile_pattern(pattern)
    assert info.value.unsupported is unsupported, str(info.value)
    assert isinstance(info.value, ValueError)


def test_matches_nothing_message() -> None:
    with pytest.raises(PatternError, match="matches no string"):
        compile_pattern("[^\\s\\S]")


def test_blowup_is_refused_quickly() -> None:
    start = time.perf_counter()
    with pytest.raises(PatternError, match="DFA states") as info:
        compile_pattern("(a|b)*a(a|b){20}")
    assert info.value.unsupported
    assert time.perf_counter() - start < 1.0
    start = time.perf_counter()
    a = compile_pattern("^[a-z]{1,500}$")  # a long chain: minimization must stay near-linear
    assert a.size == 501 and time.perf_counter() - start < 1.0
    start = time.perf_counter()
    with pytest.raises(PatternError, match="too complex") as info:
        compile_pattern("(?:ab){1000,}")  # subsets grow with the position: quadratic work, cut off
    assert info.value.unsupported and time.perf_counter() - start < 1.5
    start = time.perf_counter()
    a = compile_pattern("[a-z]{0,1000}x")  # the unanchored start absorbs the optional letters
    assert a.size == 2 and run(a, "zzx") and not run(a, "zz") and time.perf_counter() - start < 0.1
    a = compile_pattern("(a|b)*a(a|b){5}")
    assert a.size <= MAX_STATES and run(a, "abbbbb") and not run(a, "bbbbbb")


_FORMAT_CASES = {
    "date": (["2024-01-31", "2024-02-29", "2000-02-29", "0004-02-29", "0001-12-01", "2023-04-30"],
             ["2024-13-01", "2024-00-10", "2024-01-32", "2024-1-01", "2024-01-31T", "24-01-31", "", "2024-02-30",
              "2023-02-29", "1900-02-29", "0000-12-01", "2024-04-31"]),
    "time": (["12:34:56Z", "23:59:59.123456789+05:30", "00:00:00z", "01:02:03-23:59"],
             ["24:00:00Z", "12:60:00Z", "12:34:56", "12:34Z", "12:34:56+24:00", "12:34:56.Z", "23:59:60Z",
              "12:34:56.1234567890Z"]),
    "date-time": (["2024-01-31T12:34:56Z", "2024-01-31t12:34:56.5+01:00", "2024-01-31T12:34:56z"],
                  ["2024-01-31T24:00:00Z", "2024-01-31", "2024-13-31T12:34:56Z", "2024-01-31T12:34:56",
                   "2024-01-31 12:34:56Z"]),
    "uuid4": (["123e4567-e89b-42d3-a456-426614174000"], ["123e4567-e89b-12d3-a456-426614174000",
                                                          "123e4567-e89b-42d3-c456-426614174000"]),
    "duration": (["P3DT4H", "PT0.5S", "P1W", "P1Y2M3DT4H5M6S", "PT1M", "P1Y3D", "P2M"],
                 ["P", "PT", "P1DT", "3D", "P1H", "PT1D", "P1W2D", "P1S", "PT1.S"]),
    "email": (["a.b+c@example.com", "x@a-b.c.d", "!#$%&'*+/=?^_`{|}~@x.io"],
              ["a@b", "@x.io", "a@-x.io", "a@x-.io", "a b@x.io", "a@x..io", "a@@x.io"]),
    "hostname": (["a", "example.com", "a-b.c1", "x" * 63 + ".y"],
                 ["", "-a", "a-", "a..b", "a_b", "x" * 64, "a.b."]),
    "uuid": (["123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"],
             ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g",
              "123e4567-e89b-12d3-a456-4266141740000"]),
    "uri": (["https://example.com/a?b=c#d", "urn:isbn:0451450523", "mailto:a@b.c"],
            ["example.com", "1http://x", "http:", "http://a b", "http://a<b", "http://a\\b"]),
}


@pytest.mark.parametrize("name", sorted(_FORMAT_CASES))
def test_formats(name: str) -> None:
    a = compile_pattern(format_pattern(name))
    yes, no = _FORMAT_CASES[name]
    assert [t for t in yes if not run(a, t)] == []
    assert [t for t in no if run(a, t)] == []


def test_format_sizes_and_unknown() -> None:
    assert format_pattern("no-such-format") is None
    for name in ("date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"):
        pattern = format_pattern(name)
        assert pattern.startswith("^") and pattern.endswith("$")
        assert compile_pattern(pattern).size < MAX_STATES


def _strict_ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 4 and all(p.isascii() and p.isdigit() and str(int(p)) == p and int(p) <= 255
                                   for p in parts)


def test_ipv4_against_strict_check() -> None:
    a = compile_pattern(format_pattern("ipv4"))
    rng = random.Random(4)
    pieces = ["0", "00", "1", "01", "9", "10", "99", "100", "199", "200", "249", "250", "255", "256", "300", "1000"]
    for _ in range(3000):
        parts = [rng.choice(pieces) for _ in range(rng.choice((3, 4, 4, 4, 5)))]
        text = ".".join(parts) + rng.choice(("", "", "", ".", " ", "\n"))
        assert run(a, text) == _strict_ipv4(text), text


def _ipaddress_ok(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def test_ipv6_against_ipaddress() -> None:
    a = compile_pattern(format_pattern("ipv6"))
    rng = random.Random(6)
    groups = ["0", "1", "ff", "FfF", "abcd", "12345", "g", ""]
    tails = ["1.2.3.4", "255.255.255.255", "256.1.1.1", "01.2.3.4", "1.2.3"]
    agree = valid = 0
    for _ in range(4000):
        n = rng.randint(0, 9)
        parts = [rng.choice(groups[:5]) if rng.random() < 0.9 else rng.choice(groups[5:]) for _ in range(n)]
        if parts and rng.random() < 0.6:
            k = rng.randint(0, len(parts))
            parts[k:k] = [""] if 0 < k < len(parts) else ["", ""]
        if rng.random() < 0.25:
            parts.append(rng.choice(tails))
        text = ":".join(parts)
        if rng.random() < 0.1:
            text = rng.choice((":", "::", ":::")) + text
        expected = _ipaddress_ok(text)
        assert run(a, text) == expected, text
        agree += 1
        valid += expected
    assert agree == 4000 and valid > 400
    for text in ("::", "::1", "1::", "::ffff:1.2.3.4", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:1.2.3.4", "1::8"):
        assert run(a, text) and _ipaddress_ok(text), text
    for text in (":::", "1:2:3:4:5:6:7:8:9", "1::2::3", "1:2:3:4:5:6:7:1.2.3.4", "::1.2.3.4:1", "1:"):
        assert not run(a, text) and not _ipaddress_ok(text), text


def test_compile_is_fast() -> None:
    start = time.perf_counter()
    for pattern in ("^[a-z0-9_-]{3,16}$", "^\\+?[1-9]\\d{1,14}$", "^[A-Z]{2}\\d{2}[A-Z0-9]{1,30}$",
                    "\\d+", "foo|bar|baz", "^(\\([0-9]{3}\\))?[0-9]{3}-[0-9]{4}$"):
        compile_pattern(pattern)
    for name in _FORMAT_CASES:
        compile_pattern(format_pattern(name))
    assert time.perf_counter() - start < 2.0


def test_dates_are_exactly_the_calendars_and_date_times_parse_in_python() -> None:
    """``date`` takes a day exactly when Python's calendar has it (months' lengths, leap years,
    years 0001-9999), so pydantic reads every answer back; ``date-time`` likewise."""
    date = compile_pattern(format_pattern("date"))
    stamp = compile_pattern(format_pattern("date-time"))
    rng = random.Random(12)
    for _ in range(20_000):
        y, m, d = rng.randint(0, 9999), rng.randint(0, 13), rng.randint(0, 32)
        try:
            datetime.date(y, m, d)
            real = True
        except ValueError:
            real = False
        text = f"{y:04d}-{m:02d}-{d:02d}"
        assert run(date, text) == real, text
        if real:
            when = f"{text}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999999)}Z"
            assert run(stamp, when) and datetime.datetime.fromisoformat(when.replace("Z", "+00:00")), when
