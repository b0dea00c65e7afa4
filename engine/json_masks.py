"""JSON mode's masks: which tokens of a vocabulary may come next in a recognizer's state
(``engine.json_grammar``'s, or a compiled schema's).

Masks are computed by walking a byte trie of the vocabulary from a state, pruned at the first
byte the state refuses, and kept per state key: a token can close at most ``max_closers`` levels,
open at most ``max_openers`` and begin at most ``max_commas + 1`` array items, so only that many
innermost stack entries (and whether the stack is deeper), how many levels are left to open and,
for a schema's arrays, how far the items begun are from their bounds, each up to what one token
could use, decide a mask. Inside a string, the tokens that are plain string text (no quote,
backslash, control byte or partial UTF-8 character: most of a vocabulary) are allowed wholesale
and only the rest are walked.
"""

from __future__ import annotations

import re
from collections import OrderedDict

import torch

from engine.json_grammar import MAX_DEPTH, OBJECT, Grammar, State, accepts
from engine.json_strings import PlainTokens

MASK_CACHE = 4096  # masks kept per vocabulary (a dense one is 49,152 bools: string states, a few per grammar)
SPARSE_BELOW = 16  # a state allowing at most 1/16 of the vocabulary keeps the allowed ids instead

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


class JsonVocabulary:
    """A vocabulary's byte trie and the JSON-mode masks over it (one per engine, built when it starts:
    ``engine.json_decoding``; the engine's step thread is its only user after that).

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
        closers = openers = commas = longest = 0
        for token_id, data in enumerate(token_bytes[:width]):
            if not data:
                continue
            longest = max(longest, len(data))
            if _plain_text(data):
                plain_ids.append(token_id)
            else:
                _insert(self._odd, data, token_id)
            _insert(self._trie, data, token_id)
            closers = max(closers, data.count(b"}") + data.count(b"]"))
            openers = max(openers, data.count(b"{") + data.count(b"["))
            commas = max(commas, data.count(b","))
        self._plain = torch.zeros(width, dtype=torch.bool)
        self._plain[plain_ids] = True
        self.plain_tokens = PlainTokens.of({i: token_bytes[i].decode() for i in plain_ids}, width)
        self._plain_chars = torch.zeros(width, dtype=torch.int64)  # a plain token's characters (code points)
        self._plain_chars[self.plain_tokens.ids] = self.plain_tokens.lengths
        self.max_closers = closers
        self.max_openers = openers
        self.max_commas = commas
        self.max_bytes = longest  # (at least the characters a token holds)
        self._most_chars = int(self._plain_chars.max())
        self._masks: OrderedDict = OrderedDict()
        self._tokens = token_bytes
        self.walked = 0  # masks computed (not taken from the cache): for tests and figures

    def advance(self, state: State, token_id: int, grammar: Grammar = OBJECT) -> State | None:
        """The state after token ``token_id``, None when the token cannot come next."""
        if not 0 <= token_id < min(self.width, len(self._tokens)) or not self._tokens[token_id]:
            return None
        return accepts(self._tokens[token_id], state, grammar.step)

    def constraint(self, state: State, grammar: Grammar = OBJECT) -> torch.Tensor:
        """What may come next in ``state`` (EOS never, until the object closes): the allowed token
        ids (int64) when they are few, as outside strings, else a bool mask over ``width``, True
        where banned. Kept per state key, the ids in 8 bytes a token, a mask in a byte per
        vocabulary entry (49 KB for SmolLM2): most states are sparse."""
        key = (grammar.name, self._key(state, grammar))
        entry = self._masks.get(key)
        if entry is not None:
            self._masks.move_to_end(key)
            return entry
        self.walked += 1
        members = getattr(grammar, "string_members", None)
        members = None if members is None else members(state)
        room = None if members is not None else grammar.plain_room(state)
        if members is not None:  # (alike alternatives, each in a string: the plain tokens one of them takes)
            allowed = torch.zeros(self.width, dtype=torch.bool)
            most = -1
            for member in members:
                own = grammar.plain_room(member)
                if own is None:  # (a key being matched, an enum, a narrow pattern: its own mask, kept)
                    entry = self.constraint(member, grammar).cpu()
                    if entry.dtype == torch.bool:
                        allowed |= ~entry
                    else:
                        allowed[entry] = True
                elif callable(own):  # (a pattern's run over the plain tokens: kept by the member's key, found
                    allowed |= self._plain_of(member, own, grammar)  # by QA: 16 recomputed, 0.3 s a mask)
                else:
                    most = max(most, own)
            if most >= 0:
                allowed |= self._plain_chars <= most
            allowed &= self._plain
        elif room is None:
            allowed = torch.zeros(self.width, dtype=torch.bool)
        elif callable(room):  # (a pattern: its automaton run over the plain tokens as tensors)
            allowed = room(self.plain_tokens)
        elif room >= self._most_chars:
            allowed = self._plain.clone()
        else:  # (a string's maxLength: the plain tokens that fit)
            allowed = self._plain & (self._plain_chars <= room)
        ids: list[int] = []
        _walk(self._trie if room is None and members is None else self._odd, state, ids, {}, {}, grammar.step)
        if ids:
            allowed[torch.tensor(ids)] = True
        elif not bool(allowed.any()):  # (no token at all: plain ones may have passed without a walk)
            allowed[self.eos_token_ids] = True
        sparse = int(allowed.sum()) <= self.width // SPARSE_BELOW
        entry = (allowed.nonzero().squeeze(1) if sparse else ~allowed).to(self.device)
        self._masks[key] = entry
        if len(self._masks) > MASK_CACHE:
            self._masks.popitem(last=False)
        return entry

    def _plain_of(self, member: State, run, grammar: Grammar) -> torch.Tensor:  # noqa: ANN001 - plain_room's function
        """A member's plain tokens by its pattern (``run``), kept in the cache under its own key."""
        key = (grammar.name, "plain", self._key(member, grammar))
        entry = self._masks.get(key)
        if entry is None:
            entry = self._masks[key] = run(self.plain_tokens)
            if len(self._masks) > MASK_CACHE:
                self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(key)
        return entry

    def banned(self, state: State, grammar: Grammar = OBJECT) -> torch.Tensor:
        """``constraint`` as a bool mask over ``width``, True for the tokens that cannot come next."""
        entry = self.constraint(state, grammar)
        if entry.dtype == torch.bool:
            return entry
        mask = torch.ones(self.width, dtype=torch.bool, device=entry.device)
        mask[entry] = False
        return mask

    def _key(self, state: State, grammar: Grammar) -> tuple:
        """``state`` as far as one token can tell it apart (the module's docstring): its stack cut to
        what a token can close, the levels still free to open as far as a token could use them (near
        ``MAX_DEPTH`` fewer openers pass: found by QA, a shallow state's mask allowed a 65th level),
        and a schema's array frames as their distance to their bounds (``cache_frame``)."""
        mode, stack, aux, ws = state
        keep = self.max_closers + 1
        levels = self.max_openers + 1 + grammar.depth_reach
        room = min(MAX_DEPTH - len(stack), levels)
        cut = tuple(grammar.cache_frame(f, self.max_commas + 1) for f in stack[-keep:])
        if len(stack) > keep:
            cut = ("deeper", *cut)
        return (mode, cut, grammar.cache_aux(mode, aux, self.max_bytes, levels), ws, room)


def _insert(trie: dict, data: bytes, token_id: int) -> None:
    node = trie
    for b in data:
        node = node.setdefault(b, {})
    node.setdefault(None, []).append(token_id)  # key None: the tokens that end here


def _walk(node: dict, state: State, ids: list[int], memo: dict, same: dict, step) -> None:  # noqa: ANN001
    """Collect into ``ids`` the tokens under ``node`` whose bytes ``state`` accepts (``step``: a
    grammar's). Each step's result is kept once per distinct state (``same``: equal states are one
    object), so the memo of steps is keyed by the state's identity: a deep state (a long stack,
    alternatives side by side) is hashed once when it first arises, not at each trie edge."""
    for b, child in node.items():
        if b is None:
            ids.extend(child)
            continue
        key = (id(state), b)
        nxt = memo.get(key, memo)
        if nxt is memo:
            nxt = step(state, b)
            if nxt is not None:
                nxt = same.setdefault(nxt, nxt)
            memo[key] = nxt
        if nxt is not None:
            _walk(child, nxt, ids, memo, same, step)
