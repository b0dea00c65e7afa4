"""What a union's masks cost on SmolLM2's vocabulary: structured outputs whose alternatives start
alike (pydantic's ``Union`` of models, discriminated unions, a map beside a model, a recursive
union) are followed side by side, and each mask of such a state ORs its alternatives' own plain
tokens and walks the rest of the vocabulary through all of them. The baseline, in the same
process: the same answer under a schema with only the alternative it is written in.

For each case a fresh vocabulary cache asks the mask of every state along the answer as it is
written, byte by byte, under the union and under the alternative alone, and the bench prints the
masks computed, their total and largest time, and the ratio. The recursive case writes the same
tree 10 and 40 levels deep: its masks are shared across levels, so both compute as many.

    .venv/bin/python bench/union_masks.py
"""

from __future__ import annotations

import json
import time

from engine import json_grammar as g
from engine.config import EngineConfig
from engine.json_masks import JsonVocabulary
from engine.json_schema import compile_schema
from engine.llm_engine import LLMEngine

_PERSON = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]+ [A-Z][a-z]+$"},
                                            "born": {"type": "string", "format": "date"}}, "required": ["name", "born"]}
_COMPANY = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Z][A-Za-z ]+$"},
                                             "founded": {"type": "string", "format": "date"}},
            "required": ["name", "founded"]}
_MAP = {"type": "object", "additionalProperties": {"type": "integer"}}
_MODEL = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


def _tagged(i: int) -> dict:
    return {"type": "object", "properties": {"text": {"type": "string", "maxLength": 40 + i}, "kind": {"const": f"k{i}"}},
            "required": ["text", "kind"]}


def _patterned(i: int) -> dict:
    return {"type": "object", "properties": {"name": {"type": "string", "pattern": f"^[a-z]{{{i + 1},}}$"},
                                             f"x{i}": {"type": "integer"}}, "required": ["name"]}


CASES = [  # (name, the union, the alternative written, the answer's value)
    ("Union[Person, Company]", {"anyOf": [_PERSON, _COMPANY]}, _COMPANY, '{"name":"Acme Widgets","founded":"1999-01-02"}'),
    ("Union[dict[str, int], Model]", {"anyOf": [_MAP, _MODEL]}, _MAP, '{"apples":3,"pears":5}'),
    ("discriminated, 2 models", {"oneOf": [_tagged(0), _tagged(1)], "discriminator": {"propertyName": "kind"}},
     _tagged(1), '{"text":"The quick brown fox","kind":"k1"}'),
    ("discriminated, 16 models", {"oneOf": [_tagged(i) for i in range(16)]}, _tagged(5),
     '{"text":"The quick brown fox","kind":"k5"}'),
    ("int | float", {"anyOf": [{"type": "integer"}, {"type": "number"}]}, {"type": "number"}, "-12.5"),
    ("16 models, a pattern each", {"anyOf": [_patterned(i) for i in range(16)]}, _patterned(0), '{"name":"abcdefgh"}'),
]
_TREE = {"$defs": {"T": {"anyOf": [{"type": "object", "additionalProperties": {"$ref": "#/$defs/T"}},
                                   {"type": "object", "properties": {"n": {"$ref": "#/$defs/T"}}}]}},
         "type": "object", "properties": {"t": {"$ref": "#/$defs/T"}}, "required": ["t"]}


def _masks(base: JsonVocabulary, schema: dict, text: str) -> tuple[int, float, float]:
    """Masks computed, total and largest seconds, along ``text`` from a cold cache."""
    vocab = JsonVocabulary(base._tokens, base.width, base.eos_token_ids)
    grammar = compile_schema(json.dumps(schema))
    state, times = grammar.initial, []
    for b in text.encode():
        t = time.perf_counter()
        vocab.constraint(state, grammar)
        times.append(time.perf_counter() - t)
        state = grammar.step(state, b)
    assert g.is_complete(state), text
    return vocab.walked, sum(times), max(times)


def main() -> None:
    engine = LLMEngine(EngineConfig())
    engine.prepare_json()
    base = engine.json.vocab
    print(f"vocabulary: {base.width} tokens, {int(base.plain_tokens.ids.numel())} plain-text ones")
    wrap = lambda sub: {"type": "object", "properties": {"a": sub}, "required": ["a"]}  # noqa: E731
    for name, union, alone, value in CASES:
        text = '{"a":' + value + "}"
        n1, t1, w1 = _masks(base, wrap(union), text)
        n0, t0, w0 = _masks(base, wrap(alone), text)
        print(f"{name}: {len(text)} bytes; union {n1} masks, {t1 * 1000:.0f} ms (largest {w1 * 1000:.1f}); "
              f"the alternative alone {n0} masks, {t0 * 1000:.0f} ms (largest {w0 * 1000:.1f}); ratio {t1 / t0:.2f}x")
    for depth in (10, 40):
        text = '{"t":' + '{"n":' * depth + "{}" + "}" * depth + "}"
        n, t, w = _masks(base, _TREE, text)
        print(f"recursive union {depth} levels deep: {len(text)} bytes, {n} masks, {t * 1000:.0f} ms "
              f"(largest {w * 1000:.1f})")


if __name__ == "__main__":
    main()
