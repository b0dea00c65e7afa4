"""``gateway.tool_calls`` without a model: the calls' schema (each tool's definitions and
references moved under its own names) compiles and takes exactly the calls of the tools given,
the scanner reads calls out of any chunking of the answer's text, and a conversation's earlier
calls and results are rendered as turns the model reads."""

from __future__ import annotations

import json
import random

import pydantic
import pytest

from engine import json_grammar as g
from engine.json_schema import compile_schema
from gateway.formats import make_usage
from gateway.schemas import ChatCompletionRequest
from gateway.tool_answers import CallScanner, ToolCallFormat
from gateway.tool_calls import Tool, ToolPlan
from gateway.tool_checks import check_tools


class Leaf(pydantic.BaseModel):
    value: int


class Tree(pydantic.BaseModel):
    leaf: Leaf
    children: list[Tree] = pydantic.Field(max_length=2)


TREE = Tree.model_json_schema()  # $defs with Leaf and Tree, a root $ref into them
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"$ref": "#/definitions/Y"},
                                          "next": {"$ref": "#"}},
         "required": ["x"], "definitions": {"Y": {"enum": ["up", "down"]}}, "additionalProperties": False}


def _accepts(schema: dict, text: str) -> bool:
    grammar = compile_schema(json.dumps(schema))
    state = g.accepts(text.encode(), grammar.initial, grammar.step)
    return state is not None and g.is_complete(state)


def _calls(*calls: tuple[str, object]) -> str:
    return json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in calls]})


def test_the_calls_schema_takes_the_tools_calls_and_nothing_else() -> None:
    plan = ToolPlan("required", [Tool("tree", TREE), Tool("point", POINT), Tool("clock", {"type": "object",
                                                                                       "properties": {}, "additionalProperties": False})])
    schema = plan.schema()
    tree = {"leaf": {"value": 1}, "children": [{"leaf": {"value": 2}, "children": []}]}
    point = {"x": 3, "y": "up", "next": {"x": 4}}
    assert _accepts(schema, _calls(("tree", tree), ("point", point), ("clock", {})))
    assert _accepts(schema, _calls(("point", {"x": 1})))
    for wrong in (_calls(("tree", point)), _calls(("point", {"x": 1, "y": "left"})), _calls(("nope", {})),
                  _calls(("clock", {"x": 1})), _calls(("point", {"x": 1, "next": {"y": "up"}})),
                  json.dumps({"tool_calls": []}), _calls(("tree", {"leaf": {"value": 1}, "children": [tree] * 3}))):
        assert not _accepts(schema, wrong), wrong
    one = ToolPlan("required", plan.tools, parallel=False).schema()
    assert _accepts(one, _calls(("clock", {}))) and not _accepts(one, _calls(("clock", {}), ("clock", {})))


def test_a_named_plan_is_the_tools_own_parameters() -> None:
    plan = ToolPlan("named", [Tool("point", POINT)])
    assert plan.schema() is POINT
    assert _accepts(plan.schema(), json.dumps({"x": 1, "y": "down"}))


def _answer(rng: random.Random) -> tuple[str, list[tuple[str, str]]]:
    calls = []
    for _ in range(rng.randint(1, 3)):
        args = {"s": rng.choice(['a"b', "x\\", "}]{[,", "é\n"]), "n": [rng.randint(-9, 9), {"k": None}]}
        calls.append((rng.choice(["f", "g_h", "x-1"]), args))
    ascii_only = rng.random() < 0.5
    text = json.dumps({"tool_calls": [{"name": n, "arguments": a} for n, a in calls]},
                      indent=rng.choice([None, 1, 2]), ensure_ascii=ascii_only)
    shown = [(n, json.dumps(a, separators=(",", ":"), ensure_ascii=ascii_only)) for n, a in calls]
    return text, shown


def test_the_scanner_reads_calls_from_any_chunking() -> None:
    rng = random.Random(7)
    for _ in range(300):
        text, calls = _answer(rng)
        scanner, events, i = CallScanner(), [], 0
        while i < len(text):
            step = rng.randint(1, 9)
            events += scanner.feed(text[i:i + step])
            i += step
        assert scanner.complete and scanner.names == [n for n, _ in calls]
        assert scanner.arguments == [a for _, a in calls]  # (as written, without the blanks between tokens)
        pieces: dict[int, str] = {}
        for kind, index, value in events:  # each call's name once, before its arguments
            if kind == "call":
                assert index not in pieces and value == calls[index][0]
                pieces[index] = ""
            else:
                pieces[index] += value
        assert [pieces[k] for k in sorted(pieces)] == scanner.arguments


def test_a_cut_answer_shows_what_was_written() -> None:
    scanner = CallScanner()
    scanner.feed('{"tool_calls": [{"name": "f", "arguments": {"a": [1, 2')
    assert scanner.names == ["f"] and scanner.arguments == ['{"a":[1,2'] and not scanner.complete
    named = CallScanner("f")
    assert named.feed("  ") == [] and named.feed(' {"a"') == [("call", 0, "f"), ("args", 0, '{"a"')]
    assert named.feed(' : "a b" ,\n "q\\"r s"') == [("args", 0, ':"a b","q\\"r s"')]  # (a string's blanks are its own)


def test_the_format_shows_calls_as_openai_does() -> None:
    fmt = ToolCallFormat(model="m", choice="required")
    text = _calls(("f", {"a": 1}), ("g", {}))
    answer = fmt.response([text, text[:30]], ["stop", "length"], make_usage(3, 4, 0)).model_dump()
    first, cut = answer["choices"]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in first["message"]["tool_calls"]] \
        == [("f", {"a": 1}), ("g", {})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in first["message"]["tool_calls"])
    assert cut["finish_reason"] == "length"
    named = ToolCallFormat(model="m", choice="named", named="f")
    whole = named.response(['{"a": 1}'], ["stop"], make_usage(3, 4, 0)).model_dump()["choices"][0]
    assert whole["finish_reason"] == "stop" and whole["message"]["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    chunks = [named.text_chunk(0, piece) for piece in ('{"a"', ": 1}")]
    deltas = [c.model_dump()["choices"][0]["delta"]["tool_calls"] for c in chunks]
    # a call's name and its first arguments in one entry (found by review: two entries of one index)
    assert len(deltas[0]) == 1 and deltas[0][0]["id"].startswith("call_")
    assert deltas[0][0]["function"] == {"name": "f", "arguments": '{"a"'}
    assert deltas[1] == [{"index": 0, "function": {"arguments": ":1}"}}]


def _body(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", **fields})


WEATHER = {"type": "function", "function": {"name": "weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def test_earlier_calls_and_results_are_turns_the_model_reads() -> None:
    body = _body(tools=[WEATHER], tool_choice="required", messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sun"}]},
        {"role": "user", "content": "And Oslo?"}])
    plan = check_tools(body)
    messages = plan.messages(body)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "user"]
    assert set(messages[0]) == {"role", "content"} and messages[0]["content"].startswith("Be brief.\n\n")
    assert json.dumps({"name": "weather", "description": "Weather in a city.",
                       "parameters": WEATHER["function"]["parameters"]}) in messages[0]["content"]
    assert messages[2]["content"] == 'Calling weather with {"city": "Paris"}. Calling weather with not json.'
    # (one function called twice: each result says which call it answers)
    assert messages[3]["content"] == 'Result of weather with not json: rain\nResult of weather with {"city": "Paris"}: sun'
    once = _body(messages=[*body.messages[:2], {"role": "assistant", "tool_calls": body.messages[2].tool_calls[:1]},
                           {"role": "tool", "tool_call_id": "c1", "content": "sun"}])
    assert check_tools(once).messages(once)[3]["content"] == "Result of weather: sun"
    off = _body(tools=[WEATHER], tool_choice="none", messages=body.messages)
    assert check_tools(off).choice is None and "Result of weather" in check_tools(off).messages(off)[3]["content"]
    assert check_tools(off).messages(off)[0]["content"] == "Be brief."  # no call asked: the tools are not shown
    assert check_tools(_body(messages=[{"role": "user", "content": "Hi"}])) is None


@pytest.mark.parametrize("parameters", [None, {}])
def test_a_function_without_parameters_takes_an_empty_object(parameters) -> None:  # noqa: ANN001
    tool = {"type": "function", "function": {"name": "now", **({} if parameters is None else {"parameters": parameters})}}
    plan = check_tools(_body(tools=[tool], tool_choice="required", messages=[{"role": "user", "content": "Hi"}]))
    assert _accepts(plan.schema(), _calls(("now", {}))) and not _accepts(plan.schema(), _calls(("now", {"a": 1})))


def test_auto_shows_text_as_content_and_json_as_calls() -> None:
    fmt = ToolCallFormat(model="m", choice="auto")
    text, calls = "  Sunny, 18 degrees.", _calls(("f", {"a": 1}))
    answer = fmt.response([text, "\n" + calls, ""], ["stop", "stop", "stop"], make_usage(3, 4, 0)).model_dump()
    said, called, empty = answer["choices"]
    assert (said["message"]["content"], said["message"]["tool_calls"], said["finish_reason"]) == (text, None, "stop")
    assert called["message"]["content"] is None and called["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in called["message"]["tool_calls"]] == ["f"]
    assert empty["message"]["content"] == ""
    # streamed: blanks are held until the answer says which; then text as content, or call pieces
    stream = ToolCallFormat(model="m", choice="auto")
    assert stream.text_chunk(0, "  ") is None and stream.text_chunk(1, "\n") is None
    assert stream.text_chunk(0, "Sun").model_dump()["choices"][0]["delta"] == {"content": "  Sun"}
    assert stream.text_chunk(0, "ny {").model_dump()["choices"][0]["delta"] == {"content": "ny {"}
    pieces = [stream.text_chunk(1, p) for p in (calls[:25], calls[25:])]
    deltas = [d for c in pieces if c is not None for d in c.model_dump()["choices"][0]["delta"]["tool_calls"]]
    assert deltas[0]["function"]["name"] == "f"
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"a":1}'
    assert stream.finish_chunk(0, "stop").model_dump()["choices"][0]["finish_reason"] == "stop"
    assert stream.finish_chunk(1, "stop").model_dump()["choices"][0]["finish_reason"] == "tool_calls"
    blank = ToolCallFormat(model="m", choice="auto")
    assert blank.text_chunk(0, " ") is None
    assert blank.finish_chunk(0, "stop").model_dump()["choices"][0]["delta"] == {"content": " "}
    # an empty answer: "" streamed as whole (found by the re-check: none, which the SDK reads as null)
    assert blank.finish_chunk(1, "stop").model_dump()["choices"][0]["delta"] == {"content": ""}


def test_property_names_are_names_and_nested_definitions_stay() -> None:
    """Found by QA: a property named ``default`` kept its ``$ref`` unrewritten, one named
    ``definitions`` was dropped, and a nested ``$defs`` entry replaced the root's of its name."""
    item = {"type": "object", "properties": {"label": {"type": "string", "maxLength": 5}}, "required": ["label"],
            "additionalProperties": False}
    params = {"type": "object", "properties": {
        "default": {"$ref": "#/$defs/Item"}, "examples": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        "definitions": {"type": "string", "maxLength": 3}, "enum": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]},
        "b": {"$ref": "#/$defs/B"}},
        "required": ["default", "examples", "definitions", "enum", "b"], "additionalProperties": False,
        "$defs": {"Item": item, "A": {"enum": ["AAA"]},
                  "B": {"type": "object", "properties": {"z": {"$ref": "#/$defs/A"}}, "required": ["z"],
                        "additionalProperties": False, "$defs": {"A": {"type": "integer"}}}}}
    plan = ToolPlan("required", [Tool("f", params)])
    good = {"default": {"label": "x"}, "examples": [], "definitions": "abc",
            "enum": {"default": {"label": "y"}, "examples": [], "definitions": "", "enum": 1, "b": {"z": "AAA"}},
            "b": {"z": "AAA"}}
    assert _accepts(plan.schema(), _calls(("f", good)))
    assert _accepts(params, json.dumps(good))  # (the same as the parameters alone: named)
    for wrong in ({**good, "b": {"z": 1}}, {**good, "enum": {"tool_calls": []}}, {**good, "definitions": "abcd"}):
        assert not _accepts(plan.schema(), _calls(("f", wrong))), wrong
