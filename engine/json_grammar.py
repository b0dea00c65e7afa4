"""JSON mode: decoding constrained to one JSON object (OpenAI's ``response_format: json_object``).

A byte-level pushdown recognizer of RFC 8259 JSON whose top level is an object, and the masks it
gives over a tokenizer's vocabulary: at each step a JSON-mode sequence may only sample a token
whose bytes keep its output a prefix of such an object; once the object closes the sequence ends
(finish reason "stop"; EOS is never allowed before that).

    state = (mode, stack, aux, ws)     stack: "o" / "a" per open object / array, innermost last
    step(state, byte) -> state | None  None: the byte cannot come next

Strings are checked as UTF-8 (a lead byte, then its continuation bytes) and escapes as JSON's
(``\\uXXXX`` with four hex digits). Whitespace between tokens is allowed in runs of at most
``MAX_WHITESPACE`` bytes and nesting to ``MAX_DEPTH`` levels, so a model cannot spin forever on
blank lines (a known failure of unconstrained whitespace in JSON-mode decoding).

Masks are computed by walking a byte trie of the vocabulary from a state, pruned at the first
byte the state refuses, and kept per state key: a token can close at most ``max_closers`` levels
and open at most ``max_openers``, so only that many innermost stack entries (and whether the stack
is deeper) and how many levels are left to open, up to that many, decide a mask. Inside
a string, the tokens that are plain string text (no quote, backslash, control byte or partial
UTF-8 character: most of a vocabulary) are allowed wholesale and only the rest are walked.
"""

from __future__ import annotations

import re
from collections import OrderedDict

import torch

MAX_WHITESPACE = 32  # bytes of whitespace in a row between a JSON document's tokens
MAX_DEPTH = 64  # objects and arrays open at once
MASK_CACHE = 4096  # masks kept per vocabulary (a dense one is 49,152 bools: string states, a few per grammar)
SPARSE_BELOW = 16  # a state allowing at most 1/16 of the vocabulary keeps the allowed ids instead

State = tuple  # (mode, stack, aux, ws)

# modes
START, OBJ_FIRST, OBJ_KEY, COLON, VALUE, ARR_FIRST, AFTER, DONE = "S", "{", "k", ":", "v", "[", "a", "D"
KEY_STR, VAL_STR = "K", "V"  # aux: (escape, utf8): escape 0, -1 after "\", 1..4 hex digits due
NUMBER, LITERAL = "N", "L"  # aux: the number's part / the literal's bytes still due

_WS = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
_LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}
# number parts: which bytes continue it (to which part); a part in _NUM_END may end the number
_NUM = {
    "-": ((_DIGITS - {ord("0")}, "int"), ({ord("0")}, "zero")),
    "zero": (({ord(".")}, "dot"), (frozenset(b"eE"), "e")),
    "int": ((_DIGITS, "int"), ({ord(".")}, "dot"), (frozenset(b"eE"), "e")),
    "dot": ((_DIGITS, "frac"),),
    "frac": ((_DIGITS, "frac"), (frozenset(b"eE"), "e")),
    "e": ((frozenset(b"+-"), "sign"), (_DIGITS, "exp")),
    "sign": ((_DIGITS, "exp"),),
    "exp": ((_DIGITS, "exp"),),
}
_NUM_END = frozenset(("zero", "int", "frac", "exp"))

INITIAL: State = (START, (), None, 0)
# lead bytes whose first continuation byte has a narrower range than 80..BF (RFC 3629's table):
# (continuation bytes due, lowest, highest first one)
_UTF8_LEADS = {0xE0: (2, 0xA0, 0xBF), 0xED: (2, 0x80, 0x9F), 0xF0: (3, 0x90, 0xBF), 0xF4: (3, 0x80, 0x8F)}


def _closed(stack: tuple) -> State:
    """The state after a value ends with ``stack`` open around it."""
    return (AFTER, stack, None, 0) if stack else (DONE, (), None, 0)


def _value(stack: tuple, b: int) -> State | None:
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
    if b in _DIGITS:
        return (NUMBER, stack, "int", 0)
    rest = _LITERALS.get(b)
    return None if rest is None else (LITERAL, stack, rest, 0)


def _string(state: State, b: int) -> State | None:
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
        return (COLON, stack, None, 0) if mode == KEY_STR else _closed(stack)
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
        return _string(state, b)
    if mode == NUMBER:
        for chars, part in _NUM[aux]:
            if b in chars:
                return (NUMBER, stack, part, 0)
        if aux not in _NUM_END:
            return None
        return step(_closed(stack), b)  # the byte after a number is read after the value
    if mode == LITERAL:
        if b != aux[0]:
            return None
        return (LITERAL, stack, aux[1:], 0) if len(aux) > 1 else _closed(stack)
    if b in _WS:
        return (mode, stack, aux, ws + 1) if ws < MAX_WHITESPACE else None
    if mode == START:
        return (OBJ_FIRST, ("o",), None, 0) if b == 0x7B else None
    if mode == OBJ_FIRST or mode == OBJ_KEY:
        if b == 0x22:
            return (KEY_STR, stack, (0, 0), 0)
        return _closed(stack[:-1]) if b == 0x7D and mode == OBJ_FIRST else None
    if mode == COLON:
        return (VALUE, stack, None, 0) if b == 0x3A else None
    if mode == VALUE:
        return _value(stack, b)
    if mode == ARR_FIRST:
        return _closed(stack[:-1]) if b == 0x5D else _value(stack, b)
    if mode == AFTER:
        top = stack[-1]
        if b == 0x2C:  # ,
            return (OBJ_KEY, stack, None, 0) if top == "o" else (VALUE, stack, None, 0)
        if (b == 0x7D and top == "o") or (b == 0x5D and top == "a"):
            return _closed(stack[:-1])
        return None
    return None  # DONE: only whitespace


def accepts(data: bytes, state: State = INITIAL) -> State | None:
    """The state after all of ``data``, or None when some byte of it cannot come next."""
    for b in data:
        state = step(state, b)
        if state is None:
            return None
    return state


def is_complete(state: State) -> bool:
    return state[0] == DONE


def _in_plain_string(state: State) -> bool:
    return (state[0] == KEY_STR or state[0] == VAL_STR) and state[2] == (0, 0)


_NOT_PLAIN = re.compile(rb'["\\\x00-\x1f]')


def _plain_text(data: bytes) -> bool:
    """Bytes a string may hold that leave it as it was: no quote, backslash or control byte, and
    whole UTF-8 characters."""
    if not data or _NOT_PLAIN.search(data) is not None:
        return False
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class ObjectGrammar:
    """Any JSON object: JSON mode's grammar. A grammar gives the recognizer's ``initial`` state,
    ``step``, ``is_complete``, ``plain_string`` (the state is inside a free string: plain text
    leaves it as it was) and ``name`` (its masks' cache key; ``engine.json_schema`` makes others)."""

    name = "json_object"
    initial = INITIAL
    step = staticmethod(step)
    is_complete = staticmethod(is_complete)
    plain_string = staticmethod(_in_plain_string)


OBJECT = ObjectGrammar()


class JsonVocabulary:
    """A vocabulary's byte trie and the JSON-mode masks over it (one per engine, built on the first
    JSON-mode request; the engine's step thread is its only user).

    ``token_bytes[i]`` is token ``i``'s bytes (empty: never allowed, e.g. a special token);
    ``width`` the logits' width (ids past the vocabulary are never allowed); ``eos_token_ids`` what
    a state no token may follow allows instead (it cannot arise with a byte-level vocabulary,
    which has every single byte; the answer then ends there); masks are kept on ``device``."""

    def __init__(self, token_bytes: list[bytes], width: int, eos_token_ids: list[int] = (),
                 device: torch.device | str = "cpu") -> None:
        self.width = width
        self.eos_token_ids = list(eos_token_ids)
        self.device = torch.device(device)
        self._trie: dict = {}
        self._odd: dict = {}  # the trie of the tokens that are not plain string text
        plain_ids = []
        closers = openers = 0
        for token_id, data in enumerate(token_bytes[:width]):
            if not data:
                continue
            if _plain_text(data):
                plain_ids.append(token_id)
            else:
                _insert(self._odd, data, token_id)
            _insert(self._trie, data, token_id)
            closers = max(closers, data.count(b"}") + data.count(b"]"))
            openers = max(openers, data.count(b"{") + data.count(b"["))
        self._plain = torch.zeros(width, dtype=torch.bool)
        self._plain[plain_ids] = True
        self.max_closers = closers
        self.max_openers = openers
        self._masks: OrderedDict = OrderedDict()
        self._tokens = token_bytes
        self.walked = 0  # masks computed (not taken from the cache): for tests and figures

    def advance(self, state: State, token_id: int, grammar: ObjectGrammar = OBJECT) -> State | None:
        """The state after token ``token_id``, None when the token cannot come next."""
        if not 0 <= token_id < min(self.width, len(self._tokens)) or not self._tokens[token_id]:
            return None
        for b in self._tokens[token_id]:
            state = grammar.step(state, b)
            if state is None:
                return None
        return state

    def constraint(self, state: State, grammar: ObjectGrammar = OBJECT) -> torch.Tensor:
        """What may come next in ``state`` (EOS never, until the object closes): the allowed token
        ids (int64) when they are few, as outside strings, else a bool mask over ``width``, True
        where banned. Kept per state key, the ids in 8 bytes a token, a mask in a byte per
        vocabulary entry (49 KB for SmolLM2): most states are sparse."""
        key = (grammar.name, self._key(state))
        entry = self._masks.get(key)
        if entry is not None:
            self._masks.move_to_end(key)
            return entry
        self.walked += 1
        in_string = grammar.plain_string(state)
        allowed = self._plain.clone() if in_string else torch.zeros(self.width, dtype=torch.bool)
        ids: list[int] = []
        _walk(self._odd if in_string else self._trie, state, ids, {}, grammar.step)
        if ids:
            allowed[torch.tensor(ids)] = True
        else:
            allowed[self.eos_token_ids] = True
        sparse = int(allowed.sum()) <= self.width // SPARSE_BELOW
        entry = (allowed.nonzero().squeeze(1) if sparse else ~allowed).to(self.device)
        self._masks[key] = entry
        if len(self._masks) > MASK_CACHE:
            self._masks.popitem(last=False)
        return entry

    def banned(self, state: State, grammar: ObjectGrammar = OBJECT) -> torch.Tensor:
        """``constraint`` as a bool mask over ``width``, True for the tokens that cannot come next."""
        entry = self.constraint(state, grammar)
        if entry.dtype == torch.bool:
            return entry
        mask = torch.ones(self.width, dtype=torch.bool, device=entry.device)
        mask[entry] = False
        return mask

    def _key(self, state: State) -> tuple:
        """``state`` with its stack cut to what any one token can reach (see the module's docstring),
        and the levels still free to open, as far as one token could use them (near ``MAX_DEPTH``
        fewer openers pass: found by QA, a mask of a shallow state allowed a 65th level)."""
        mode, stack, aux, ws = state
        keep = self.max_closers + 1
        room = min(MAX_DEPTH - len(stack), self.max_openers + 1)
        if len(stack) > keep:
            stack = ("deeper", *stack[-keep:])
        return (mode, stack, aux, ws, room)


def _insert(trie: dict, data: bytes, token_id: int) -> None:
    node = trie
    for b in data:
        node = node.setdefault(b, {})
    node.setdefault(None, []).append(token_id)  # key None: the tokens that end here


def _walk(node: dict, state: State, ids: list[int], memo: dict, step) -> None:  # noqa: ANN001 - a grammar's step
    """Collect into ``ids`` the tokens under ``node`` whose bytes ``state`` accepts."""
    for b, child in node.items():
        if b is None:
            ids.extend(child)
            continue
        key = (state, b)
        nxt = memo.get(key, memo)
        if nxt is memo:
            nxt = memo[key] = step(state, b)
        if nxt is not None:
            _walk(child, nxt, ids, memo, step)
