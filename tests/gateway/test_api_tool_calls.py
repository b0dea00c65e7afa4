"""Tool calls over HTTP with the official ``openai`` client on SmolLM2: ``tool_choice: "required"``
answers with calls of the tools given, whose arguments follow each tool's parameters (streamed
or not, the SDK's stream accumulator included), a named tool_choice with that function's
arguments, ``auto`` with calls or the model's text as its first token says, and a conversation
goes on after a call with its result; what OpenAI refuses and what is not served are 400s that
say so."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest

from tests.gateway.test_api_validation import assert_error, post

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now."}}


class Order(pydantic.BaseModel):
    item: str = pydantic.Field(max_length=30)
    quantity: int = pydantic.Field(ge=1, le=99)


class Basket(pydantic.BaseModel):
    orders: list[Order] = pydantic.Field(max_length=3)
    note: str | None = pydantic.Field(default=None, max_length=30)


ORDER = openai.pydantic_function_tool(Basket, name="place_order", description="Order items.")
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _valid_weather(arguments: str) -> dict:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    assert isinstance(args["city"], str) and len(args["city"]) <= 40
    return args


def test_required_calls_follow_the_tools(api) -> None:  # noqa: ANN001
    client = api.openai()
    resp = client.chat.completions.create(model=api.model, messages=ASK, tools=[WEATHER, CLOCK, ORDER],
                                          tool_choice="required", max_tokens=200, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in ("get_weather", "get_time", "place_order")
        if call.function.name == "get_weather":
            _valid_weather(call.function.arguments)
        elif call.function.name == "get_time":
            assert json.loads(call.function.arguments) == {}
        else:
            Basket.model_validate_json(call.function.arguments)
    assert len({c.id for c in choice.message.tool_calls}) == len(choice.message.tool_calls)
    # streamed: the same calls, id and name first, then the arguments in pieces
    chunks = list(client.chat.completions.create(model=api.model, messages=ASK, tools=[WEATHER, CLOCK, ORDER],
                                                 tool_choice="required", max_tokens=200, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if piece.id is not None:
                assert piece.index not in calls and piece.function.arguments == ""
                calls[piece.index] = {"name": piece.function.name, "arguments": ""}
            else:
                calls[piece.index]["arguments"] += piece.function.arguments
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_sampled_calls_are_each_valid(api) -> None:  # noqa: ANN001
    resp = api.openai().chat.completions.create(model=api.model, messages=ASK, tools=[WEATHER, ORDER],
                                                tool_choice="required", parallel_tool_calls=False, max_tokens=150,
                                                temperature=1.0, seed=11, n=4)
    finished = [c for c in resp.choices if c.finish_reason == "tool_calls"]
    assert finished
    for choice in finished:
        assert len(choice.message.tool_calls) == 1  # parallel_tool_calls false: one call
        call = choice.message.tool_calls[0]
        if call.function.name == "get_weather":
            _valid_weather(call.function.arguments)
        else:
            Basket.model_validate_json(call.function.arguments)


def test_a_named_function_is_called(api) -> None:  # noqa: ANN001
    client = api.openai()
    named = {"type": "function", "function": {"name": "get_weather"}}
    resp = client.chat.completions.create(model=api.model, messages=ASK, tools=[CLOCK, WEATHER],
                                          tool_choice=named, max_tokens=60, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"  # (as OpenAI answers a forced function)
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    _valid_weather(call.function.arguments)
    # the SDK's stream helper puts the pieces together, and parse() reads a pydantic tool's arguments
    with client.beta.chat.completions.stream(model=api.model, messages=ASK, tools=[CLOCK, WEATHER],
                                             tool_choice=named, max_tokens=60, temperature=0) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    parsed = client.beta.chat.completions.parse(
        model=api.model, messages=[{"role": "user", "content": "Order two apples."}], tools=[ORDER],
        tool_choice={"type": "function", "function": {"name": "place_order"}}, max_tokens=150, temperature=0)
    call = parsed.choices[0].message.tool_calls[0]
    if parsed.choices[0].finish_reason == "stop":
        assert isinstance(call.function.parsed_arguments, Basket)


def test_a_cut_call_says_length(api) -> None:  # noqa: ANN001
    resp = api.openai().chat.completions.create(model=api.model, messages=ASK, tools=[WEATHER],
                                                tool_choice="required", max_tokens=12, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    for call in choice.message.tool_calls or []:  # what was written: a name whole, arguments begun
        assert call.function.name == "get_weather"
        assert '"city"'.startswith(call.function.arguments[1:7]) or call.function.arguments == ""


def test_the_conversation_goes_on_after_a_call(api) -> None:  # noqa: ANN001
    client = api.openai()
    first = client.chat.completions.create(model=api.model, messages=ASK, tools=[WEATHER],
                                           tool_choice="required", max_tokens=60, temperature=0)
    calls = first.choices[0].message.tool_calls
    messages = [*ASK, first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "18 degrees, sunny"} for c in calls]
    answer = client.chat.completions.create(model=api.model, messages=messages, tools=[WEATHER],
                                            tool_choice="none", max_tokens=30, temperature=0)
    assert answer.choices[0].message.content and answer.choices[0].message.tool_calls is None
    # (found by QA: shown its calls as the JSON it writes, the model wrote that JSON again as text)
    assert "tool_calls" not in answer.choices[0].message.content
    # the result reached the model: a longer result, a longer prompt by as many tokens
    longer = [*messages[:-len(calls)], *({"role": "tool", "tool_call_id": c.id, "content": "18 degrees, sunny" * 5}
                                         for c in calls)]
    again = client.chat.completions.create(model=api.model, messages=longer, max_tokens=1, temperature=0)
    assert again.usage.prompt_tokens - answer.usage.prompt_tokens >= 4 * 4 * len(calls)


def _token_id(api, text: str) -> int:  # noqa: ANN001
    ids = api.app.state.pagegate.engine.encode(text)
    assert len(ids) == 1, ids
    return ids[0]


@pytest.mark.parametrize("stream", [False, True])
def test_auto_lets_the_model_answer_in_text_or_calls(api, stream) -> None:  # noqa: ANN001
    """tool_choice "auto" (the default with tools): an answer that begins with "{" is held to the
    calls' schema, any other is the model's text. The model's pick is forced both ways here."""
    client = api.openai()
    brace = _token_id(api, "{")

    def ask(**fields: object) -> tuple[str | None, list, str]:
        body = dict(model=api.model, messages=ASK, tools=[WEATHER, CLOCK], max_tokens=60, temperature=0, **fields)
        if not stream:
            choice = client.chat.completions.create(**body).choices[0]
            calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
            return choice.message.content, calls, choice.finish_reason
        content, pieces, reason = None, {}, None
        for chunk in client.chat.completions.create(**body, stream=True):
            delta = chunk.choices[0].delta
            if delta.content is not None:
                content = (content or "") + delta.content
            for piece in delta.tool_calls or []:
                name, arguments = pieces.get(piece.index, (piece.function.name, ""))
                pieces[piece.index] = (name, arguments + piece.function.arguments)
            reason = chunk.choices[0].finish_reason or reason
        return content, [pieces[k] for k in sorted(pieces)], reason

    content, calls, reason = ask(logit_bias={str(brace): 100})  # "{" first: calls
    assert content is None and calls and reason in ("tool_calls", "length")
    if reason == "tool_calls":
        for name, arguments in calls:
            assert name == "get_time" and json.loads(arguments) == {} or _valid_weather(arguments)
    content, calls, reason = ask(logit_bias={str(brace): -100})  # not "{": text, as without tools
    assert content and not calls and reason in ("stop", "length")
    default = ask()  # no tool_choice: auto
    assert default == ask(tool_choice="auto")
    assert (default[0] is None) == bool(default[1])


@pytest.mark.parametrize(("fields", "param", "code"), [
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),  # no tools
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "invalid_value"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice.function", "missing_required_parameter"),
    ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools"}}, "tool_choice.type", "unsupported_parameter"),
    ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools[1].function.name", "invalid_value"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}], "tool_choice": "required"},
     "tools[0].function.name", "invalid_value"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
      "tool_choice": "required"}, "tools[0].function.parameters", "invalid_value"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"not": {}}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters", "unsupported_parameter"),
    ({"tools": [CLOCK, {"type": "function", "function": {"name": "g", "parameters": {
        "type": "object", "properties": {"s": {"type": "array", "uniqueItems": True}}}}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tools[1].function.parameters",
     "unsupported_parameter"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(17)], "tool_choice": "required"},
     "tools", "unsupported_parameter"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(17)]}, "tools",
     "unsupported_parameter"),  # (auto: the same calls' schema)
    ({"tools": [WEATHER], "tool_choice": "required", "logprobs": True}, "logprobs", "unsupported_parameter"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"},
      "messages": [{"role": "user", "content": "json"}]}, "response_format", "invalid_value"),
    ({"functions": [{"name": "f"}], "function_call": {"name": "f"}}, "functions", "unsupported_parameter"),
    # a call is certain: a stop could only cut it (found by QA: a named call cut by "," said "stop")
    ({"tools": [WEATHER], "tool_choice": "required", "stop": ","}, "stop", "unsupported_parameter"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "stop_token_ids": [11]}, "stop_token_ids", "unsupported_parameter"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools[0].function.strict",
     "invalid_type"),
    # a lone surrogate, which the tokenizer cannot take (found by review: a 500)
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]}, "tools[0]",
     "invalid_value"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "\ud800"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "x"}]}, "messages[1].tool_calls", "invalid_value"),
])
def test_what_is_refused(api, fields, param, code) -> None:  # noqa: ANN001
    body = {"model": api.model, "messages": ASK, "max_tokens": 5, **fields}
    payload = json.dumps(body).encode()  # (ensure_ascii: a lone surrogate travels as \ud800, valid JSON)
    assert_error(post(api, "/v1/chat/completions", content=payload, headers={"content-type": "application/json"}),
                 400, param=param, code=code)


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.mark.parametrize(("messages", "param"), [
    ([*ASK, {"role": "tool", "tool_call_id": "call_1", "content": "x"}], "messages[1].role"),  # no call before
    ([*ASK, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_2", "content": "x"}],
     "messages[2].tool_call_id"),
    ([*ASK, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "x"}],
     "messages[2].tool_call_id"),
    ([*ASK, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1"}],
     "messages[2].content"),
    ([*ASK, {"role": "assistant", "tool_calls": [CALL]}, {"role": "user", "content": "Well?"}], "messages[1].role"),
    ([*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]},
      {"role": "tool", "tool_call_id": "c", "content": "x"}], "messages[1].tool_calls[0].function.arguments"),
    ([*ASK, {"role": "assistant", "tool_calls": [{"type": "function", "function": CALL["function"]}]}],
     "messages[1].tool_calls[0].id"),
    ([{"role": "user", "content": "Hi", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "x"}],
     "messages[0].tool_calls"),
    ([*ASK, {"role": "function", "name": "f", "content": "x"}], "messages[1].role"),
])
def test_tool_turns_follow_openais_rules(api, messages, param) -> None:  # noqa: ANN001
    body = {"model": api.model, "messages": messages, "max_tokens": 5}
    assert_error(post(api, "/v1/chat/completions", body), 400, param=param)


def test_an_earlier_calls_escaped_surrogate_is_shown_as_sent(api) -> None:  # noqa: ANN001
    """Found by the re-check: arguments holding the escape ``\\ud800`` (valid text) were parsed
    into a lone surrogate and handed to the tokenizer: a 500."""
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"\\ud800"}'}}
    resp = post(api, "/v1/chat/completions", {"model": api.model, "max_tokens": 3, "messages": [
        *ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"}]})
    assert resp.status_code == 200, resp.text
