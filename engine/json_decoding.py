"""The engine's side of JSON mode and structured outputs: which grammar a choice decodes under,
its recognizer state after each token, and the vocabulary's masks (built once, before the engine
serves, by ``AsyncEngine.start``, or by the first request that needs them)."""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from engine import json_grammar
from engine.json_masks import JsonVocabulary
from engine.json_schema import compile_schema
from engine.request import Sequence
from engine.tokenizer import TokenBytes

logger = logging.getLogger("engine.json")
OPEN = ("open",)  # an optional grammar's state before its answer's first token says text or JSON
OPEN_MASKS = 64  # the open state's masks kept, one per grammar
_BLANK = b" \t\r\n"


class JsonDecoding:
    """``tokenizer``'s vocabulary as JSON mode reads it: special and added tokens have no bytes
    there (they are not text: ``<|im_end|>`` inside a string would end the answer or vanish from
    it), ``silent_ids`` neither; the masks are ``width`` wide, on ``device``."""

    def __init__(self, tokenizer, silent_ids: frozenset[int], eos_token_ids: list[int], width: int,  # noqa: ANN001
                 device: torch.device) -> None:
        self.tokenizer = tokenizer
        self.silent_ids = silent_ids
        self.eos_token_ids = eos_token_ids
        self.width = width
        self.device = device
        self.vocab: JsonVocabulary | None = None
        self.token_bytes: list[bytes] = []
        self._braced: torch.Tensor | None = None  # True for the tokens that begin with "{" past whitespace
        self._open: OrderedDict[str, torch.Tensor] = OrderedDict()  # grammar name -> its open state's mask

    def prepare(self) -> JsonVocabulary:
        """The vocabulary's masks, built on the first call (0.4-0.6 s for SmolLM2)."""
        if self.vocab is None:
            if self.tokenizer is None:
                raise ValueError("JSON mode needs the model's tokenizer (this model directory has none)")
            ids = list(range(min(self.width, len(self.tokenizer))))
            token_bytes = TokenBytes(self.tokenizer).of(ids)
            for i in set(getattr(self.tokenizer, "added_tokens_decoder", {})) | self.silent_ids:
                if i < len(token_bytes):
                    token_bytes[i] = b""
            self.vocab = JsonVocabulary(token_bytes, self.width, self.eos_token_ids, self.device)
            self.token_bytes = token_bytes
            braced = [t.lstrip(_BLANK)[:1] == b"{" for t in token_bytes]
            self._braced = torch.tensor(braced + [False] * (self.width - len(braced)), device=self.device)
        return self.vocab

    def start(self, seq: Sequence) -> None:
        """Give a choice its grammar and initial state, when its params ask for JSON."""
        p = seq.params
        if p.json_schema is not None:
            seq.json_grammar = p.grammar if p.grammar is not None else compile_schema(p.json_schema)
        elif p.json_object:
            seq.json_grammar = json_grammar.OBJECT
        else:
            return
        self.prepare()
        seq.json_state = OPEN if p.json_optional else seq.json_grammar.initial

    def constraint(self, seq: Sequence) -> torch.Tensor:
        """What may come next in the choice (``JsonVocabulary.constraint``: allowed ids, or a banned
        mask; before an optional grammar's first token, the tokens that begin JSON the grammar
        refuses are banned, and any other may begin free text)."""
        if seq.json_state is OPEN:
            grammar = seq.json_grammar
            mask = self._open.get(grammar.name)
            if mask is None:
                mask = self._open[grammar.name] = self._braced & self.vocab.banned(grammar.initial, grammar)
                if len(self._open) > OPEN_MASKS:
                    self._open.popitem(last=False)
            else:
                self._open.move_to_end(grammar.name)
            return mask
        return self.vocab.constraint(seq.json_state, seq.json_grammar)

    def advance(self, seq: Sequence, token: int) -> bool:
        """Read the choice's new token; True when the choice ends there: its object closed, or (a
        dead end no mask should allow) the token was one the grammar refuses. An optional
        grammar's first token that does not begin JSON lets the choice go on as free text (the
        gateway tells the answer the same way: its first character past blanks)."""
        if seq.json_state is OPEN:
            raw = self.token_bytes[token] if token < len(self.token_bytes) else b""
            if not raw.lstrip(_BLANK):
                return False  # (blanks, or a special token, which shows no text: still to be told)
            if raw.lstrip(_BLANK)[:1] != b"{":  # free text
                seq.json_state = seq.json_grammar = None
                return False
            seq.json_state = seq.json_grammar.initial
        seq.json_state = self.vocab.advance(seq.json_state, token, seq.json_grammar)
        if seq.json_state is None:
            logger.warning("request %s: a token its JSON grammar refuses was drawn; the choice ends there",
                           seq.request.request_id)
            return True
        return json_grammar.is_complete(seq.json_state)
