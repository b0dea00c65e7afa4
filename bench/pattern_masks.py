"""What a pattern string's masks cost on SmolLM2's vocabulary: the way the engine computes them
(the automaton run over the plain-text tokens as tensors; a mask's key holding the automaton
state's class) against the baseline in the same process (every token's bytes walked through the
grammar from the vocabulary's byte trie, the key holding the exact automaton state).

For each pattern, a fresh vocabulary cache asks the mask of every state along a string as it is
written, character by character, and the bench prints how many masks were computed, their total
and largest time, both ways, and the ratio; it checks that both ways give the same masks.

    .venv/bin/python bench/pattern_masks.py
"""

from __future__ import annotations

import json
import time

import torch

from engine import json_grammar as g
from engine.config import EngineConfig
from engine.json_masks import JsonVocabulary
from engine.json_schema import SchemaGrammar, compile_schema
from engine.llm_engine import LLMEngine

CASES = [  # (string rules, the text written)
    ({"pattern": "^[A-Za-z ,.]{10,400}$"}, "Hello there, this is a sentence."),
    ({"format": "email"}, "ada.lovelace@example.com"),
    ({"format": "uri", "minLength": 1, "maxLength": 2083}, "https://example.com/some/path?x=1"),
    ({"pattern": "^(ab|cd)+$", "minLength": 20, "maxLength": 60}, "abcdabcdabcdabcdabcdab"),
    ({"format": "date-time"}, "2025-05-01T12:30:00Z"),
]


class TrieWalked:
    """A schema grammar as the baseline masks it: no tensor path, the exact automaton state in the key."""

    def __init__(self, grammar: SchemaGrammar) -> None:
        self.grammar = grammar
        self.name = grammar.name + ":walked"

    def __getattr__(self, name: str):  # noqa: ANN204 - the rest as the grammar has it
        return getattr(self.grammar, name)

    def plain_room(self, state: g.State) -> int | None:
        room = self.grammar.plain_room(state)
        return None if callable(room) else room

    def cache_aux(self, mode: str, aux: object, reach: int, levels: int) -> object:
        return aux


def _masks(vocab: JsonVocabulary, grammar, text: bytes) -> tuple[list[torch.Tensor], list[float], int]:  # noqa: ANN001
    state = g.accepts(b'{"a":"', grammar.initial, grammar.step)
    masks, times, walked = [], [], vocab.walked
    for b in text:
        t = time.perf_counter()
        masks.append(vocab.banned(state, grammar))
        times.append(time.perf_counter() - t)
        state = grammar.step(state, b)
    return masks, times, vocab.walked - walked


def main() -> None:
    engine = LLMEngine(EngineConfig())
    engine.prepare_json()
    base = engine.json.vocab
    print(f"vocabulary: {base.width} tokens, {int(base.plain_tokens.ids.numel())} plain-text ones")
    for rules, text in CASES:
        grammar = compile_schema(json.dumps({"type": "object", "properties": {"a": {"type": "string", **rules}},
                                             "required": ["a"]}))
        rows = []
        for way in (TrieWalked(grammar), grammar):
            vocab = JsonVocabulary(base._tokens, base.width, base.eos_token_ids)  # (a cold cache each)
            rows.append(_masks(vocab, way, text.encode()))
        (m0, t0, n0), (m1, t1, n1) = rows
        assert all(torch.equal(a, b) for a, b in zip(m0, m1, strict=True)), rules
        print(f"{json.dumps(rules)}: {len(text)} characters; trie walk {n0} masks, {sum(t0) * 1000:.0f} ms "
              f"(largest {max(t0) * 1000:.1f}); tensors and classes {n1} masks, {sum(t1) * 1000:.0f} ms "
              f"(largest {max(t1) * 1000:.1f}); ratio {sum(t0) / sum(t1):.2f}x, same masks")


if __name__ == "__main__":
    main()
