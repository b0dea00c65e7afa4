"""JSON mode and structured outputs over HTTP with the official ``openai`` client on SmolLM2:
``response_format: {"type": "json_object"}`` makes each choice's content one JSON object, streamed
or not, sampled or greedy, in chat and text completions, and a chat that never mentions JSON is
refused as OpenAI refuses it; ``json_schema`` makes it an object of the schema (the SDK's
``parse`` with a pydantic model reads it back), and a schema the engine cannot honour is a 400
that says what and where."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Literal

import openai
import pydantic
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
    refused_turn = [{"role": "user", "content": "Describe a cat."},  # an assistant turn's refusal counts too (QA)
                    {"role": "assistant", "content": None, "refusal": "Not as JSON."},
                    {"role": "user", "content": "Please do."}]
    ok = client.chat.completions.create(model=api.model, max_tokens=5, temperature=0, response_format=JSON_FORMAT,
                                        messages=refused_turn)
    assert ok.choices[0].message.content.lstrip().startswith("{")


class Cat(pydantic.BaseModel):
    name: str
    age: int
    color: Literal["black", "white", "brown", "grey"]
    indoor: bool


class Shop(pydantic.BaseModel):
    name: str
    city: str
    cats: list[Cat]
    rating: float | None


def test_structured_outputs_parse_into_the_pydantic_model(api) -> None:  # noqa: ANN001
    """The SDK's ``parse`` sends the model's strict schema and reads the answer back into it."""
    client = api.openai()
    tom = client.chat.completions.parse(model=api.model, response_format=Cat, max_tokens=100, temperature=0, messages=[
        {"role": "user", "content": "Tell me about a cat called Tom, 4 years old, grey, lives indoors."}])
    assert tom.choices[0].finish_reason == "stop"
    assert tom.choices[0].message.parsed == Cat(name="Tom", age=4, color="grey", indoor=True)
    shop = client.chat.completions.parse(model=api.model, response_format=Shop, max_tokens=250, temperature=0,
                                         messages=[{"role": "user", "content": "Describe a pet shop with two cats."}])
    assert isinstance(shop.choices[0].message.parsed, Shop) and shop.choices[0].message.parsed.cats
    sampled = client.chat.completions.create(  # sampled and streamed: each finished choice follows the schema
        model=api.model, n=3, seed=5, temperature=1.0, max_tokens=120, stream=True,
        messages=[{"role": "user", "content": "Describe a cat."}],
        response_format={"type": "json_schema", "json_schema": {
            "name": "cat", "strict": True, "schema": Cat.model_json_schema()}})
    texts, reasons = ["", "", ""], {}
    for chunk in sampled:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
    for i, text in enumerate(texts):
        if reasons[i] == "stop":
            Cat.model_validate_json(text)
        else:
            assert reasons[i] == "length"
    assert "stop" in reasons.values()


class Booking(pydantic.BaseModel):
    guest: str = pydantic.Field(min_length=2, max_length=12)
    nights: int = pydantic.Field(ge=1, le=14)
    price: float = pydantic.Field(gt=0, lt=1000)
    code: str = pydantic.Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    arrival: datetime.date
    booked_at: datetime.datetime
    ref: uuid.UUID


class Comment(pydantic.BaseModel):
    text: str = pydantic.Field(max_length=20)
    replies: list[Comment] = pydantic.Field(max_length=2)


class Search(pydantic.BaseModel):
    query: str = pydantic.Field(max_length=30)


class Say(pydantic.BaseModel):
    text: str = pydantic.Field(max_length=40)
    polite: bool


class Happy(pydantic.BaseModel):
    mood: Literal["happy"]
    smiles: int = pydantic.Field(ge=0, le=9)


class Sad(pydantic.BaseModel):
    mood: Literal["sad"]
    tears: int = pydantic.Field(ge=0, le=9)


class Turn(pydantic.BaseModel):
    action: Search | Say  # (anyOf of two objects: followed side by side until one is left)
    feeling: Happy | Sad = pydantic.Field(discriminator="mood")  # (oneOf told apart by "mood")


class Stock(pydantic.BaseModel):
    shop: str = pydantic.Field(max_length=20)
    counts: dict[str, int] = pydantic.Field(min_length=1, max_length=4)
    best: tuple[str, int]
    crates: int = pydantic.Field(multiple_of=6, ge=0, le=60)


def test_field_rules_formats_and_recursive_models_parse_into_pydantic(api) -> None:  # noqa: ANN001
    """pydantic's ``Field`` bounds, lengths and patterns, dates, datetimes, UUIDs, a recursive
    model, a ``dict`` (a map) and a ``tuple``: every choice that stops validates as the model
    (pydantic checks the rules again), a ``Union`` of models and a discriminated one."""
    client = api.openai()
    for model, prompt in ((Booking, "Book a hotel room for Ada Lovelace: 3 nights from 2025-05-01."),
                          (Comment, "Write one short comment about cats, with no replies."),
                          (Stock, "A fruit shop has 3 apples and 5 pears; pears sell best."),
                          (Turn, "Greet the user politely; you feel happy.")):
        resp = client.chat.completions.create(
            model=api.model, n=4, seed=11, temperature=0.7, max_tokens=240, messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_schema", "json_schema": {
                "name": model.__name__, "strict": True, "schema": model.model_json_schema()}})
        stopped = [model.model_validate_json(c.message.content) for c in resp.choices if c.finish_reason == "stop"]
        assert stopped, model  # (sampled, a 135M model may also wander past the limit: those are prefixes)
    parsed = client.chat.completions.parse(model=api.model, response_format=Booking, max_tokens=240, temperature=0,
                                           messages=[{"role": "user", "content": "Book a hotel room for Ada Lovelace: "
                                                                                 "3 nights from 2025-05-01."}])
    booking = parsed.choices[0].message.parsed
    assert booking.guest == "Ada Lovelace" and booking.arrival == datetime.date(2025, 5, 1), booking


def test_json_schema_without_a_schema_is_any_object_and_needs_no_json_word(api) -> None:  # noqa: ANN001
    body = {"model": api.model, "max_tokens": 80, "temperature": 0,
            "messages": [{"role": "user", "content": "Describe a cat: name, age and color."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "anything"}}}
    resp = post(api, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    assert isinstance(json.loads(resp.json()["choices"][0]["message"]["content"]), dict)


def test_schemas_compile_in_their_tenants_turns(api) -> None:  # noqa: ANN001
    """A schema is compiled on the server's schema thread in its tenant's turn (gateway.schema_thread),
    so one tenant's burst of slow schemas holds another's back by the one compiling at most."""
    from gateway import schema_thread

    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "tag": {"pattern": f"^{uuid.uuid4().hex[:6]}$",
                                                                               "type": "string"}},
              "required": ["n", "tag"], "additionalProperties": False}
    body = {"model": api.model, "max_tokens": 4, "messages": [{"role": "user", "content": "A number, as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}}
    before = sum(w.turns[api.tenant_id] for w in list(schema_thread._workers.values()))
    assert post(api, "/v1/chat/completions", body).status_code == 200
    assert sum(w.turns[api.tenant_id] for w in list(schema_thread._workers.values())) == before + 1


@pytest.mark.parametrize(("fmt", "param", "code", "words"), [
    ({"type": "json_schema"}, "response_format.json_schema", "missing_required_parameter", "json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}, "response_format.json_schema.name",
     "missing_required_parameter", "name"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {"type": "object"}}},
     "response_format.json_schema.name", "invalid_value", "letters, digits"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}},
     "response_format.json_schema.schema", "unsupported_parameter", "root must be an object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"when": {"type": "string", "format": "color"}}}}},
     "response_format.json_schema.schema", "unsupported_parameter", "format 'color' is not supported"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 2}}}}},
     "response_format.json_schema.schema", "invalid_value", "no integer lies between its bounds"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}},
     "response_format.json_schema.schema", "invalid_value", "'strin' is not a JSON Schema type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}}},
     "response_format.json_schema.schema", "invalid_value", "names no definition"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}, "response_format.json_schema.schema",
     "invalid_type", "JSON object"),
    ({"type": "xml"}, "response_format.type", "invalid_value", "'json_object'"),
])
def test_bad_formats_are_400s_that_say_what(api, fmt, param, code, words) -> None:  # noqa: ANN001
    body = {"model": api.model, "messages": CAT, "response_format": fmt}
    err = assert_error(post(api, "/v1/chat/completions", body), 400, param=param, code=code)
    assert words in err["message"], err


def _raw_body(api, name: str, schema: str) -> str:  # noqa: ANN001
    """A chat body with ``schema`` as written (json.dumps cannot nest hundreds deep)."""
    head = json.dumps({"model": api.model, "messages": [{"role": "user", "content": "hi"}]})[:-1]
    return f'{head}, "response_format": {{"type": "json_schema", "json_schema": {{"name": "{name}", "schema": {schema}}}}}}}'


def test_a_schema_nested_hundreds_deep_is_a_400_not_a_500(api) -> None:  # noqa: ANN001
    """Found by review: the compiler recursed past Python's stack (RecursionError: a 500)."""
    levels = 300
    schema = '{"type":"object","properties":{"a":' * levels + '{"type":"integer"}' + "}}" * levels
    body = _raw_body(api, "deep", schema)
    resp = post(api, "/v1/chat/completions", content=body.encode(), headers={"content-type": "application/json"})
    err = assert_error(resp, 400, param="response_format.json_schema.schema")
    assert "nest" in err["message"]


def test_what_the_schema_qa_found(api) -> None:  # noqa: ANN001
    """A name in `required` that is not a string, and an annotation nested 300 deep (dumped for the
    cache key), were 500s; two schemas differing only in their properties' order shared a cached
    answer, so the second got the first one's order."""
    base = {"model": api.model, "messages": CAT}
    wrong = {"type": "json_schema", "json_schema": {"name": "t", "schema": {
        "type": "object", "properties": {"a": {"type": "string"}}, "required": [["a"]]}}}
    assert_error(post(api, "/v1/chat/completions", base | {"response_format": wrong}), 400,
                 param="response_format.json_schema.schema", code="invalid_value")
    deep = "[" * 300 + "]" * 300
    body = _raw_body(api, "d", '{"type": "object", "examples": ' + deep + "}")
    resp = post(api, "/v1/chat/completions", content=body.encode(), headers={"content-type": "application/json"})
    err = assert_error(resp, 400)
    assert "deep" in err["message"], err
    first, second = _ordered(api, "country", "city"), _ordered(api, "city", "country")
    assert list(json.loads(first.choices[0].message.content)) == ["country", "city"]
    assert list(json.loads(second.choices[0].message.content)) == ["city", "country"]


def _ordered(api, first: str, second: str):  # noqa: ANN001, ANN202
    schema = {"type": "object", "properties": {first: {"type": "string"}, second: {"type": "string"}},
              "required": [first, second], "additionalProperties": False}
    return api.openai().chat.completions.with_raw_response.create(
        model=api.model, max_tokens=60, temperature=0,
        messages=[{"role": "user", "content": "Where is the Eiffel Tower? Give the city and the country."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}).parse()


def test_the_cache_keeps_a_schemas_property_order(api_cached) -> None:  # noqa: ANN001
    """Found by QA: the cache key's sorted JSON lost the properties' order, so the second schema was
    served the first one's answer, in the first one's order."""
    def raw(first: str, second: str):  # noqa: ANN202
        schema = {"type": "object", "properties": {first: {"type": "string"}, second: {"type": "string"}},
                  "required": [first, second], "additionalProperties": False}
        body = {"model": api_cached.model, "max_tokens": 60, "temperature": 0,
                "messages": [{"role": "user", "content": "Where is the Eiffel Tower? Give the city and the country."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}}
        return post(api_cached, "/v1/chat/completions", body)

    first, second, again = raw("country", "city"), raw("city", "country"), raw("country", "city")
    assert (first.headers["x-cache"], second.headers["x-cache"], again.headers["x-cache"]) == ("miss", "miss", "hit")
    assert list(json.loads(second.json()["choices"][0]["message"]["content"])) == ["city", "country"]


def test_vllms_json_fields_are_served_as_a_schema(api) -> None:  # noqa: ANN001
    """A client moving from vLLM sends ``guided_json`` (a schema or its JSON text) or
    ``structured_outputs`` with ``json`` or ``json_object``; regex, choice and grammar stay refused."""
    client = api.openai()
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    tom = [{"role": "user", "content": "Tell me about a cat called Tom, 4 years old."}]
    for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)}, {"structured_outputs": {"json": schema}}):
        reply = client.chat.completions.create(model=api.model, messages=tom, max_tokens=60, temperature=0,
                                               extra_body=extra)
        assert json.loads(reply.choices[0].message.content) == {"name": "Tom", "age": 4}, extra
    anything = client.completions.create(  # any object, and no "json" word needed, as vLLM takes it
        model=api.model, prompt="Here is a dog: ", max_tokens=60, temperature=0,
        extra_body={"structured_outputs": {"json_object": True}})
    assert anything.choices[0].text.lstrip().startswith("{")
    base = {"model": api.model, "messages": tom, "max_tokens": 5}
    for fields, param, words in (
        ({"guided_json": "{not json"}, "guided_json", "not JSON"),
        ({"guided_json": [1]}, "guided_json", "JSON Schema"),
        ({"guided_json": schema, "response_format": {"type": "json_object"}}, "guided_json", "one of"),
        ({"guided_json": schema, "structured_outputs": {"json": schema}}, "structured_outputs", "one of"),
        ({"guided_json": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}},
         "response_format.json_schema.schema", "pattern"),
        ({"guided_regex": "[a-z]+"}, "guided_regex", "Regex, choice and grammar"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs", "Regex, choice and grammar"),
    ):
        err = assert_error(post(api, "/v1/chat/completions", base | fields), 400, param=param)
        assert words in err["message"], (fields, err)
