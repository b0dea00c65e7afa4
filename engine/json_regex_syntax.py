"""The syntax of JSON Schema patterns (ECMA-262 regular expressions, the subset ``engine.json_regex``
compiles): a parser from source text to a tree of character sets over code-point ranges, and the
tree's helpers the compiler uses. Nodes: ("set", ranges) ("cat", items) ("alt", alternatives)
("rep", node, least, most or None) ("bol",) ("eol",)."""

from __future__ import annotations

from collections.abc import Iterable

MAX_CP = 0x10FFFF

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, non-adjacent, surrogate-free


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
