"""JSON mode in the engine (``SamplingParams.json_object``), on the tiny random-weight model, whose
vocabulary is the 256 bytes and three special tokens: whatever the weights, each choice is one
JSON object ("stop") or, cut by ``max_tokens``, a prefix of one ("length"); the object's close
ends the choice; special tokens never appear; batch mates are unchanged; preemption keeps it."""

from __future__ import annotations

import json

from engine import json_grammar
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.conftest import EOS


def _run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, dict[int, list]]:
    """request id -> choice index -> [text, token ids, finish reason]."""
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", p, sp)
    out: dict[str, dict[int, list]] = {f"r{i}": {} for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for o in engine.step():
            for d in o.deltas:
                entry = out[o.request_id].setdefault(d.index, ["", [], None])
                entry[0] += d.text
                entry[1] += d.token_ids
                entry[2] = d.finish_reason
    return out


def test_every_choice_is_a_json_object_or_a_prefix_of_one(engine_config, tiny_model_dir) -> None:
    engine = LLMEngine(engine_config(tiny_model_dir))
    prompt = list(b"Answer in JSON: ")
    # a nudge towards closing (random weights rarely choose to), and sampling that wanders
    params = [SamplingParams(n=2, temperature=t, seed=s, max_tokens=60, json_object=True,
                             logit_bias={ord("}"): 4.0, ord("]"): 3.0, ord('"'): 2.0})
              for s, t in enumerate([0.0, 0.7, 1.0, 1.5, 2.0, 1.0, 1.0, 0.9])]
    reasons = []
    for choices in _run(engine, [prompt] * len(params), params).values():
        assert set(choices) == {0, 1}
        for text, tokens, reason in choices.values():
            assert EOS not in tokens and not set(tokens) & {257, 258}
            reasons.append(reason)
            if reason == "stop":
                assert isinstance(json.loads(text), dict), text
            else:
                assert reason == "length" and len(tokens) == 60
                assert json_grammar.accepts(text.encode()) is not None, text
    assert "stop" in reasons  # some closed within the limit


def test_the_object_closing_ends_the_choice(engine_config, tiny_model_dir) -> None:
    """Forced towards "{}" and the special tokens: the choice is "{}", ended there although it
    ignores EOS and asks for 5 tokens at least; the special tokens stayed out."""
    engine = LLMEngine(engine_config(tiny_model_dir))
    bias = {ord("{"): 100, ord("}"): 100, EOS: 100, 257: 100, 258: 100}
    params = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=5, ignore_eos=True, logit_bias=bias,
                            json_object=True, logprobs=1)
    (text, tokens, reason), = _run(engine, [list(b"x")], [params])["r0"].values()
    assert (text, tokens, reason) == ("{}", [ord("{"), ord("}")], "stop")


def test_batch_mates_are_unchanged_and_greedy_json_is_the_same_in_a_batch(engine_config, tiny_model_dir) -> None:
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    as_json = SamplingParams(temperature=0.0, max_tokens=40, json_object=True, logit_bias={ord("}"): 3.0})
    prompt = list(range(60, 80))
    alone_plain = _run(LLMEngine(engine_config(tiny_model_dir)), [prompt], [plain])["r0"]
    alone_json = _run(LLMEngine(engine_config(tiny_model_dir)), [prompt], [as_json])["r0"]
    both = _run(LLMEngine(engine_config(tiny_model_dir)), [prompt, prompt], [as_json, plain])
    assert both["r1"] == alone_plain and both["r0"] == alone_json
    assert alone_json[0][0].startswith("{") and alone_plain[0][1] != alone_json[0][1]


def test_preempted_json_choices_continue_where_they_were(engine_config, tiny_model_dir) -> None:
    """A pool too small for the batch: choices are preempted and computed again, and each ends as
    it does alone (its recognizer state lives with its output, which preemption keeps)."""
    params = [SamplingParams(temperature=0.0, max_tokens=90, json_object=True,
                             logit_bias={ord(c): float(i % 3) for c in '"}:'}) for i in range(6)]
    prompts = [list(range(30 + 7 * i, 70 + 7 * i)) for i in range(6)]
    alone = {}
    for i in range(6):
        alone[f"r{i}"] = _run(LLMEngine(engine_config(tiny_model_dir)), [prompts[i]], [params[i]])["r0"]
    engine = LLMEngine(engine_config(tiny_model_dir, num_blocks=14))
    together = _run(engine, prompts, params)
    assert engine.scheduler.num_preemptions > 0
    assert together == alone


def test_min_tokens_never_blocks_what_the_object_needs(engine_config, tiny_model_dir) -> None:
    """Found by QA: spaces forced up to the whitespace limit, where only "{" may follow, and "{" a
    stop token that ``min_tokens`` blocked: every allowed token was at -inf and a banned one was
    drawn ("stop", the text no JSON). In JSON mode the grammar alone decides; a stop token drawn
    before ``min_tokens`` does not stop the choice."""
    engine = LLMEngine(engine_config(tiny_model_dir))
    params = SamplingParams(temperature=0.0, max_tokens=45, min_tokens=40, json_object=True,
                            logit_bias={ord(" "): 100}, stop_token_ids=[ord("{")])
    (text, tokens, reason), = _run(engine, [list(b"x")], [params])["r0"].values()
    assert text.startswith(" " * json_grammar.MAX_WHITESPACE + "{")
    assert json_grammar.accepts(text.encode()) is not None and reason == "length", (text, reason)


def test_an_optional_grammar_holds_only_an_answer_begun_with_a_brace(engine_config, tiny_model_dir) -> None:
    """``json_optional`` (a tool call the model may make): forced to "{", the choice is the schema's
    object; forced to another first byte, it is free text (a "}" the grammar would refuse at once
    included); EOS first is an empty answer."""
    engine = LLMEngine(engine_config(tiny_model_dir))
    schema = json.dumps({"type": "object", "properties": {"a": {"enum": [1]}}, "required": ["a"],
                         "additionalProperties": False})
    cases = {
        "json": {ord("{"): 100, ord("}"): 100, ord('"'): 50},  # "{}" would close at once: the schema wants "a"
        "text": {ord("x"): 100, ord("}"): 99},
        "eos": {EOS: 100},
    }
    params = [SamplingParams(temperature=0.0, max_tokens=12, logit_bias=bias, json_schema=schema, json_optional=True)
              for bias in cases.values()]
    out = _run(engine, [list(b"Say: ")] * len(params), params)
    (json_text, _, json_reason), = out["r0"].values()
    assert (json.loads(json_text), json_reason) == ({"a": 1}, "stop")
    (text, tokens, reason), = out["r1"].values()
    assert text[0] == "x" and "}" in text and reason == "length" and len(tokens) == 12
    (empty, tokens, reason), = out["r2"].values()
    assert (empty, reason) == ("", "stop")
    plain = _run(engine, [list(b"Say: ")], [SamplingParams(temperature=0.0, max_tokens=12, logit_bias=cases["text"])])
    assert plain["r0"][0][0] == text  # free text: what it is without the grammar


def test_json_optional_needs_a_grammar() -> None:
    import pytest

    with pytest.raises(ValueError, match="json_optional"):
        SamplingParams(json_optional=True)
    with pytest.raises(ValueError, match="json_optional"):
        SamplingParams(json_object=True, json_optional="yes")


def test_an_optional_grammars_json_is_not_cut_by_stops_and_min_tokens_hold_its_open_state(
        engine_config, tiny_model_dir) -> None:
    """Found by review: under an optional grammar (a tool call under "auto") a stop cut the call's
    JSON, and EOS drawn before ``min_tokens`` turned the answer into free text that later began
    with "{". Now stops apply to a text answer only, and the open state bans EOS until
    ``min_tokens``, as plain text does."""
    engine = LLMEngine(engine_config(tiny_model_dir))
    schema = json.dumps({"type": "object", "properties": {"a": {"enum": [1]}}, "required": ["a"],
                         "additionalProperties": False})
    json_bias = {ord("{"): 100, ord('"'): 60, ord(":"): 50, ord("1"): 40, ord("}"): 30}  # (over the blanks)
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, json_schema=schema, json_optional=True, stop=['"'],
                       stop_token_ids=[ord(":")], logit_bias=json_bias),
        SamplingParams(temperature=0.0, max_tokens=30, json_object=True, json_optional=True, stop=["x"],
                       logit_bias={ord("x"): 100}),
        SamplingParams(temperature=0.0, max_tokens=30, json_object=True, json_optional=True, min_tokens=3,
                       logit_bias={EOS: 100, ord("{"): 50, ord('"'): 40, ord("}"): 30}),
    ]
    out = _run(engine, [list(b"Say: ")] * len(params), params)
    (called, _, reason), = out["r0"].values()
    assert (json.loads(called), reason) == ({"a": 1}, "stop")
    (text, _, reason), = out["r1"].values()
    assert (text, reason) == ("", "stop")  # a text answer: its stop applies (and is not shown)
    (held, tokens, reason), = out["r2"].values()
    assert EOS not in tokens[:3] and held.startswith("{") and json_grammar.accepts(held.encode()) is not None
