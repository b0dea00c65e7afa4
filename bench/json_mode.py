"""What JSON mode (``response_format: json_object``) and structured outputs (``json_schema``) cost
in the engine, against plain decoding of the same requests in the same process, rounds alternated.

Each round runs ``--batch`` chat prompts that ask for a JSON object through ``LLMEngine.step``
twice: in JSON mode (greedy; with ``--schema``, constrained to a schema of six properties, an
enum, an integer, an array of strings and an optional nested object; with ``--rules``, to one of
seven whose values have rules: a length, a pattern, the email, date and uuid formats, integer and
number bounds; with ``--unions``, to one of pydantic's unions of models (plain and discriminated),
a map and a tuple whose second item is an integer or a number; with ``--tools``, to the calls of
sixteen tools under ``tool_choice: "required"``, the gateway's schema and prompt), then plain (greedy; ``ignore_eos`` and the JSON run's own lengths,
so both decode the same number of tokens). It prints the time per generated token of each and
their ratio, the time spent getting the masks (computed, or taken from their cache) and how many
were computed, how many JSON answers parse and how many ``max_tokens`` cut (a cut answer is a
prefix of an object). The one-time cost of a process's first JSON-mode request (the vocabulary's
bytes and trie) is printed first.

    .venv/bin/python bench/json_mode.py [--batch 8] [--max-tokens 160] [--rounds 3] [--schema | --rules | --unions | --tools]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

ASKS = ["Describe a cat as JSON with the keys name, age and color.",
        "Give three fruits and their colors as a JSON object.",
        "Return a JSON object with a city's name, country and population.",
        "Describe a book as JSON: title, author, year.",
        "Write a JSON object for a user profile with name, email and age.",
        "List two planets and their moons as JSON.",
        "Describe a car as a JSON object: make, model, year, color.",
        "Give the weather for today as JSON with temperature and conditions."]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "kind": {"enum": ["animal", "thing", "place", "person", "other"]},
    "count": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    "details": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
        "color": {"type": "string"}, "size": {"type": "number"}}, "required": ["color", "size"]}]},
    "ok": {"type": "boolean"}}, "required": ["name", "kind", "count", "tags", "details", "ok"]}
RULES = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 40}, "email": {"type": "string", "format": "email"},
    "born": {"type": "string", "format": "date"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"}, "id": {"type": "string", "format": "uuid"},
    "score": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["name", "email", "born", "age", "code", "id", "score"]}
_SEARCH = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
_SAY = {"type": "object", "properties": {"text": {"type": "string"}, "polite": {"type": "boolean"}},
        "required": ["text", "polite"]}
UNIONS = {"type": "object", "properties": {  # (what pydantic writes for Union, discriminated unions, dict, tuple)
    "action": {"anyOf": [_SEARCH, _SAY]},
    "item": {"oneOf": [{"type": "object", "properties": {"kind": {"const": "fruit"}, "sweet": {"type": "boolean"}},
                        "required": ["kind", "sweet"]},
                       {"type": "object", "properties": {"kind": {"const": "tool"}, "weight": {"type": "number"}},
                        "required": ["kind", "weight"]}], "discriminator": {"propertyName": "kind"}},
    "counts": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 4},
    "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"anyOf": [{"type": "integer"},
                                                                             {"type": "number"}]}],
             "items": False, "minItems": 2}},
    "required": ["action", "item", "counts", "pair"]}


def _tools() -> tuple[dict, list[list[dict]]]:
    """The calls' schema of sixteen tools (``gateway.tool_calls``) and each ask's messages with them shown."""
    from gateway.schemas import ChatCompletionRequest
    from gateway.tool_checks import check_tools

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                   "required": ["city", "unit"]}}},
             {"type": "function", "function": {"name": "search", "parameters": _SEARCH}},
             {"type": "function", "function": {"name": "say", "parameters": _SAY}},
             {"type": "function", "function": {"name": "describe", "parameters": SCHEMA}}]
    tools += [{"type": "function", "function": {"name": f"lookup_{i}", "description": f"Table {i}.", "parameters": {
        "type": "object", "properties": {"key": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["key"]}}}
              for i in range(12)]
    messages = []
    plan = None
    for ask in ASKS:
        body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": ask}],
                                                     "tools": tools, "tool_choice": "required"})
        plan = check_tools(body)
        messages.append(plan.messages(body))
    return plan.schema(), messages


def _run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams],
         ) -> tuple[float, list[str], int, int]:
    """Seconds, each request's text, tokens generated, choices cut by ``max_tokens``."""
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"{time.perf_counter_ns()}-{i}", p, sp)
    texts: dict[str, str] = {}
    order: list[str] = []
    tokens = cut = 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id not in texts:
                order.append(out.request_id)
                texts[out.request_id] = ""
            for d in out.deltas:
                texts[out.request_id] += d.text
                tokens += len(d.token_ids)
                cut += d.finish_reason == "length"
    return time.perf_counter() - t0, [texts[r] for r in sorted(order)], tokens, cut


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--schema", action="store_true", help="structured outputs instead of JSON mode")
    ap.add_argument("--rules", action="store_true", help="structured outputs with value rules (formats, bounds)")
    ap.add_argument("--unions", action="store_true", help="structured outputs with unions of models, a map, a tuple")
    ap.add_argument("--tools", action="store_true", help="tool calls of sixteen tools (tool_choice required)")
    args = ap.parse_args()
    schema = UNIONS if args.unions else RULES if args.rules else SCHEMA if args.schema else None
    chats = [[{"role": "user", "content": ask}] for ask in ASKS]
    if args.tools:
        schema, chats = _tools()
    engine = LLMEngine(EngineConfig())
    tok = engine.tokenizer
    prompts = [list(tok.apply_chat_template(chats[i % len(chats)], add_generation_prompt=True, tokenize=True,
                                            return_dict=False))
               for i in range(args.batch)]
    t0 = time.perf_counter()
    engine.prepare_json()
    print(f"first JSON-mode request's one-time set-up (vocabulary bytes and trie): "
          f"{(time.perf_counter() - t0) * 1000:.0f} ms")

    vocab = engine.json.vocab
    masks_time = [0.0]
    constraint = vocab.constraint

    def timed_constraint(state, grammar):  # noqa: ANN001, ANN202
        t = time.perf_counter()
        try:
            return constraint(state, grammar)
        finally:
            masks_time[0] += time.perf_counter() - t

    vocab.constraint = timed_constraint
    rows = []
    for r in range(args.rounds):
        walked0, masks_time[0] = vocab.walked, 0.0
        fmt = {"json_schema": json.dumps(schema)} if schema else {"json_object": True}
        json_params = [SamplingParams(temperature=0.0, max_tokens=args.max_tokens, **fmt)] * args.batch
        t_json, texts, n_json, cut = _run(engine, prompts, json_params)
        mask_s = masks_time[0]
        lengths = [len(tok.encode(t, add_special_tokens=False)) for t in texts]
        plain_params = [SamplingParams(temperature=0.0, max_tokens=max(1, n), ignore_eos=True) for n in lengths]
        t_plain, _, n_plain, _ = _run(engine, prompts, plain_params)
        parsed = 0
        for t in texts:
            try:
                value = json.loads(t)
            except ValueError:
                continue
            parsed += isinstance(value, dict) and (not schema or list(value) == list(schema["properties"]))
        rows.append((t_json / n_json * 1000, t_plain / n_plain * 1000))
        print(f"round {r + 1}: JSON {t_json / n_json * 1000:.2f} ms/token ({n_json} tokens), plain "
              f"{t_plain / n_plain * 1000:.2f} ms/token ({n_plain} tokens), ratio {t_json / n_json / (t_plain / n_plain):.3f}; "
              f"masks {mask_s * 1000:.1f} ms ({mask_s / t_json:.1%} of the JSON run), computed "
              f"{vocab.walked - walked0}; {parsed}/{len(texts)} answers parse as objects, {cut} cut by max_tokens")
    ratio = statistics.median(j / p for j, p in rows)
    print(f"median ratio JSON / plain per token: {ratio:.3f} over {args.rounds} rounds (batch {args.batch})")


if __name__ == "__main__":
    main()
