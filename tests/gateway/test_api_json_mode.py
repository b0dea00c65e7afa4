"""JSON mode over HTTP with the official ``openai`` client (``response_format: {"type":
"json_object"}``) on SmolLM2: each choice's content is one JSON object, streamed or not, sampled or
greedy, in chat and text completions; a chat that never mentions JSON is refused as OpenAI refuses
it; ``json_schema`` is refused as not supported; the cache keeps JSON-mode answers apart."""

from __future__ import annotations

import json

import openai
import pytest

from engine import json_grammar
from tests.gateway.test_api_validation import assert_error, post

pytestmark = pytest.mark.slow

JSON_FORMAT = {"type": "json_object"}
CAT = [{"role": "user", "content": "Describe a cat as JSON with the keys name, age and color."}]


def test_chat_answers_are_json_objects(api) -> None:  # noqa: ANN001
    client = api.openai()
    greedy = client.chat.completions.create(model=api.model, messages=CAT, max_tokens=120, temperature=0,
                                            response_format=JSON_FORMAT)
    assert greedy.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(greedy.choices[0].message.content), dict)
    sampled = client.chat.completions.create(model=api.model, messages=CAT, max_tokens=150, temperature=1.0,
                                             seed=3, n=4, response_format=JSON_FORMAT)
    reasons = [c.finish_reason for c in sampled.choices]
    for choice in sampled.choices:  # sampled, a choice may wander past the limit: then a prefix of one
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
        else:
            assert json_grammar.accepts(choice.message.content.encode()) is not None
    assert "stop" in reasons
    chunks = list(client.chat.completions.create(model=api.model, messages=CAT, max_tokens=120, temperature=0,
                                                 response_format=JSON_FORMAT, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == greedy.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_without_json_mode_the_same_chat_is_not_a_json_object(api) -> None:  # noqa: ANN001
    """The constraint is what makes the answer parse: this model, asked plainly, fences its JSON."""
    client = api.openai()
    plain = client.chat.completions.create(model=api.model, messages=CAT, max_tokens=120, temperature=0)
    with pytest.raises(ValueError):
        json.loads(plain.choices[0].message.content)


def test_a_cut_answer_is_a_prefix_and_says_length(api) -> None:  # noqa: ANN001
    resp = api.openai().chat.completions.create(model=api.model, messages=CAT, max_tokens=6, temperature=0,
                                                response_format=JSON_FORMAT)
    choice = resp.choices[0]
    assert choice.finish_reason == "length" and resp.usage.completion_tokens == 6
    assert json_grammar.accepts(choice.message.content.encode()) is not None


def test_text_completions_take_json_mode(api) -> None:  # noqa: ANN001
    prompt = 'Here is a dog as JSON: {"name": "Rex", "age": 3}\nHere is a cat as JSON: '
    resp = api.openai().completions.create(model=api.model, prompt=prompt, max_tokens=80, temperature=0,
                                           extra_body={"response_format": JSON_FORMAT})
    assert resp.choices[0].finish_reason == "stop", resp.choices[0].text
    assert isinstance(json.loads(resp.choices[0].text), dict)


def test_a_chat_that_never_says_json_is_refused_as_openai_refuses_it(api) -> None:  # noqa: ANN001
    client = api.openai()
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=api.model, messages=[{"role": "user", "content": "Describe a cat."}],
                                       response_format=JSON_FORMAT)
    assert err.value.body["param"] == "messages" and "'json'" in err.value.body["message"]
    # any message may say it, in any case, in a content part too
    ok = client.chat.completions.create(
        model=api.model, max_tokens=40, temperature=0, response_format=JSON_FORMAT,
        messages=[{"role": "system", "content": [{"type": "text", "text": "Reply in Json."}]},
                  {"role": "user", "content": "Describe a cat."}])
    assert ok.choices[0].message.content.lstrip().startswith("{")


def test_json_schema_and_unknown_types_are_refused(api) -> None:  # noqa: ANN001
    body = {"model": api.model, "messages": CAT,
            "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "schema": {"type": "object"}}}}
    err = assert_error(post(api, "/v1/chat/completions", body), 400, param="response_format",
                       code="unsupported_parameter")
    assert "json_object" in err["message"]
    body["response_format"] = {"type": "xml"}
    err = assert_error(post(api, "/v1/chat/completions", body), 400, param="response_format.type")
    assert "'xml'" in err["message"] and "'json_object'" in err["message"]
