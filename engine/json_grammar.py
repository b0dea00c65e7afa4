"""JSON mode: decoding constrained to one JSON object (OpenAI's ``response_format: json_object``).

A byte-level pushdown recognizer of RFC 8259 JSON whose top level is an object: at each step a
JSON-mode sequence may only sample a token whose bytes keep its output a prefix of such an object
(``engine.json_masks`` turns states into masks over a vocabulary); once the object closes the
sequence ends (finish reason "stop"; EOS is never allowed before that). ``engine.json_schema``
compiles a JSON Schema onto the same states and helpers.

    state = (mode, stack, aux, ws)     stack: "o" / "a" per open object / array, innermost last
    step(state, byte) -> state | None  None: the byte cannot come next

Strings are checked as UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
U+10FFFF) and escapes as JSON's (``\\uXXXX`` with four hex digits). Whitespace between tokens is
allowed in runs of at most ``MAX_WHITESPACE`` bytes and nesting to ``MAX_DEPTH`` levels, so a model
cannot spin forever on blank lines (a known failure of unconstrained whitespace in JSON-mode
decoding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

MAX_WHITESPACE = 32  # bytes of whitespace in a row between a JSON document's tokens
MAX_DEPTH = 64  # objects and arrays open at once

State = tuple  # (mode, stack, aux, ws)

# modes
START, OBJ_FIRST, OBJ_KEY, COLON, VALUE, ARR_FIRST, AFTER, DONE = "S", "{", "k", ":", "v", "[", "a", "D"
KEY_STR, VAL_STR = "K", "V"  # aux: (escape, utf8): escape 0, -1 after "\", 1..4 hex digits due
NUMBER, LITERAL = "N", "L"  # aux: the number's part / the literal's bytes still due

WHITESPACE = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}
# number parts: which bytes continue it (to which part); a part in NUMBER_ENDS may end the number
NUMBER_PARTS = {
    "-": ((DIGITS - {ord("0")}, "int"), ({ord("0")}, "zero")),
    "zero": (({ord(".")}, "dot"), (frozenset(b"eE"), "e")),
    "int": ((DIGITS, "int"), ({ord(".")}, "dot"), (frozenset(b"eE"), "e")),
    "dot": ((DIGITS, "frac"),),
    "frac": ((DIGITS, "frac"), (frozenset(b"eE"), "e")),
    "e": ((frozenset(b"+-"), "sign"), (DIGITS, "exp")),
    "sign": ((DIGITS, "exp"),),
    "exp": ((DIGITS, "exp"),),
}
NUMBER_ENDS = frozenset(("zero", "int", "frac", "exp"))

INITIAL: State = (START, (), None, 0)
# lead bytes whose first continuation byte has a narrower range than 80..BF (RFC 3629's table):
# (continuation bytes due, lowest, highest first one)
_UTF8_LEADS = {0xE0: (2, 0xA0, 0xBF), 0xED: (2, 0x80, 0x9F), 0xF0: (3, 0x90, 0xBF), 0xF4: (3, 0x80, 0x8F)}


def closed(stack: tuple) -> State:
    """The state after a value ends with ``stack`` open around it."""
    return (AFTER, stack, None, 0) if stack else (DONE, (), None, 0)


def value_start(stack: tuple, b: int) -> State | None:
    """The state after byte ``b`` starts a value inside ``stack``."""
    if b == 0x22:  # "
        return (VAL_STR, stack, (0, 0), 0)
    if b == 0x7B or b == 0x5B:  # { [
        if len(stack) >= MAX_DEPTH:
            return None
        return ((OBJ_FIRST, stack + ("o",), None, 0) if b == 0x7B else (ARR_FIRST, stack + ("a",), None, 0))
    if b == 0x2D:  # -
        return (NUMBER, stack, "-", 0)
    if b == 0x30:
        return (NUMBER, stack, "zero", 0)
    if b in DIGITS:
        return (NUMBER, stack, "int", 0)
    rest = LITERALS.get(b)
    return None if rest is None else (LITERAL, stack, rest, 0)


def string_step(state: State, b: int) -> State | None:
    mode, stack, (esc, utf8), _ = state
    if utf8:
        if isinstance(utf8, tuple):  # the first continuation byte of a lead with a narrower range
            left, low, high = utf8
            return (mode, stack, (0, left - 1), 0) if low <= b <= high else None
        return (mode, stack, (0, utf8 - 1), 0) if 0x80 <= b <= 0xBF else None
    if esc == -1:
        if b in _ESCAPES:
            return (mode, stack, (0, 0), 0)
        return (mode, stack, (4, 0), 0) if b == 0x75 else None  # \u
    if esc:
        return (mode, stack, (esc - 1, 0), 0) if b in _HEX else None
    if b == 0x22:  # the closing quote
        return (COLON, stack, None, 0) if mode == KEY_STR else closed(stack)
    if b == 0x5C:
        return (mode, stack, (-1, 0), 0)
    if b < 0x20:  # control characters must be escaped
        return None
    if b < 0x80:
        return state
    if 0xC2 <= b <= 0xDF:
        return (mode, stack, (0, 1), 0)
    if 0xE0 <= b <= 0xF4:  # no overlong forms, UTF-16 surrogates or code points past U+10FFFF
        return (mode, stack, (0, _UTF8_LEADS.get(b, 2 if b <= 0xEF else 3)), 0)
    return None


def step(state: State, b: int) -> State | None:
    """The recognizer's state after byte ``b``, or None when ``b`` cannot come next."""
    mode, stack, aux, ws = state
    if mode == KEY_STR or mode == VAL_STR:
        return string_step(state, b)
    if mode == NUMBER:
        for chars, part in NUMBER_PARTS[aux]:
            if b in chars:
                return (NUMBER, stack, part, 0)
        if aux not in NUMBER_ENDS:
            return None
        return step(closed(stack), b)  # the byte after a number is read after the value
    if mode == LITERAL:
        if b != aux[0]:
            return None
        return (LITERAL, stack, aux[1:], 0) if len(aux) > 1 else closed(stack)
    if b in WHITESPACE:
        return (mode, stack, aux, ws + 1) if ws < MAX_WHITESPACE else None
    if mode == START:
        return (OBJ_FIRST, ("o",), None, 0) if b == 0x7B else None
    if mode == OBJ_FIRST or mode == OBJ_KEY:
        if b == 0x22:
            return (KEY_STR, stack, (0, 0), 0)
        return closed(stack[:-1]) if b == 0x7D and mode == OBJ_FIRST else None
    if mode == COLON:
        return (VALUE, stack, None, 0) if b == 0x3A else None
    if mode == VALUE:
        return value_start(stack, b)
    if mode == ARR_FIRST:
        return closed(stack[:-1]) if b == 0x5D else value_start(stack, b)
    if mode == AFTER:
        top = stack[-1]
        if b == 0x2C:  # ,
            return (OBJ_KEY, stack, None, 0) if top == "o" else (VALUE, stack, None, 0)
        if (b == 0x7D and top == "o") or (b == 0x5D and top == "a"):
            return closed(stack[:-1])
        return None
    return None  # DONE: only whitespace


def accepts(data: bytes, state: State = INITIAL, step=step) -> State | None:  # noqa: ANN001 - a grammar's step
    """The state after all of ``data`` (read by ``step``: this recognizer's, or a grammar's), or
    None when some byte of it cannot come next."""
    for b in data:
        state = step(state, b)
        if state is None:
            return None
    return state


def is_complete(state: State) -> bool:
    return state[0] == DONE


def in_plain_string(state: State) -> bool:
    return (state[0] == KEY_STR or state[0] == VAL_STR) and state[2] == (0, 0)


PLAIN_ANY = 1 << 30  # plain_room's "no limit"


def plain_room(state: State) -> int | None:
    """Inside a free string (plain text leaves it as it was): no limit; elsewhere None."""
    return PLAIN_ANY if in_plain_string(state) else None


class Grammar(Protocol):
    """What ``engine.json_masks`` and the engine need of a grammar: its ``initial`` state,
    ``step``, ``is_complete``, ``plain_room`` (inside a string, how many characters of plain text
    may come next whatever they are: such tokens are allowed wholesale; or a function of the
    vocabulary's ``PlainTokens`` giving the mask of those allowed; None elsewhere), ``name``
    (its masks' cache key), ``cache_frame`` (a stack frame as that key holds it, given how many
    array items one token can begin), ``cache_aux`` (the same for a state's aux, given how many
    characters one token can hold and how many free levels a key tells apart), ``depth_reach``
    (how many levels below a value it may need: a key tells the levels still free apart that
    far) and, optionally, ``string_members`` (a state's alternatives when each is inside a string:
    the plain tokens one of them takes may come next)."""

    name: str
    initial: State
    depth_reach: int

    def step(self, state: State, b: int) -> State | None: ...

    def is_complete(self, state: State) -> bool: ...

    def plain_room(self, state: State) -> int | Callable | None: ...

    def cache_frame(self, frame: object, reach: int) -> object: ...

    def cache_aux(self, mode: str, aux: object, reach: int, levels: int) -> object: ...


class ObjectGrammar:
    """Any JSON object: JSON mode's grammar (``engine.json_schema.SchemaGrammar`` is a schema's)."""

    name = "json_object"
    initial = INITIAL
    depth_reach = 0
    step = staticmethod(step)
    is_complete = staticmethod(is_complete)
    plain_room = staticmethod(plain_room)

    @staticmethod
    def cache_frame(frame: object, reach: int) -> object:  # noqa: ARG004 - "o" / "a": nothing to cut
        return frame

    @staticmethod
    def cache_aux(mode: str, aux: object, reach: int, levels: int) -> object:  # noqa: ARG004 - nothing to cut
        return aux


OBJECT: Grammar = ObjectGrammar()
