"""Hostile requests: wrong types everywhere, absurd numbers, broken bodies, broken auth. Every one
must be an OpenAI-format 4xx (never a 500, never a traceback), and the engine must survive them."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.test_api_validation import assert_error

pytestmark = pytest.mark.slow  # the session's gateway holds the real engine

BASE = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}

CHAT_CASES = [
    ({"max_tokens": -1}, 400, "max_tokens"),
    # OpenAI's bookkeeping fields are checked as OpenAI checks them (a QA find: taken silently)
    ({"store": "yes"}, 400, "store"),
    ({"parallel_tool_calls": "yes"}, 400, "parallel_tool_calls"),
    ({"metadata": [1]}, 400, "metadata"),
    ({"metadata": {"k": 1}}, 400, "metadata.k"),
    ({"service_tier": "ultra"}, 400, "service_tier"),
    ({"max_tokens": 10**30}, 400, "messages"),  # more than the context: context_length_exceeded
    ({"max_tokens": 100_000}, 400, "messages"),
    ({"max_tokens": 2.5}, 400, "max_tokens"),
    ({"max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ({"n": 0}, 400, "n"),
    ({"n": 1000}, 400, "n"),
    ({"n": -1}, 400, "n"),
    ({"n": "2"}, 400, "n"),
    ({"temperature": -1}, 400, "temperature"),
    ({"temperature": None, "top_p": 2}, 400, "top_p"),
    ({"top_p": -0.5}, 400, "top_p"),
    ({"top_k": -2}, 400, "top_k"),
    ({"seed": 2**70}, 400, "seed"),
    ({"seed": -(2**64)}, 400, "seed"),
    ({"seed": 1.5}, 400, "seed"),
    ({"stop": [f"s{i}" for i in range(100)]}, 400, "stop"),
    ({"stop": [1, 2]}, 400, "stop[0]"),
    ({"stop": {"a": 1}}, 400, "stop"),
    ({"stop": [""]}, 400, "stop[0]"),
    ({"stop": ""}, 400, "stop"),
    ({"stop_token_ids": [10**9], "min_tokens": 1}, 400, "stop_token_ids[0]"),
    ({"stop_token_ids": [2, -5], "min_tokens": 1}, 400, "stop_token_ids[1]"),
    ({"stop_token_ids": [10**30]}, 400, "stop_token_ids[0]"),
    ({"stop_token_ids": list(range(1000))}, 400, "stop_token_ids"),
    ({"presence_penalty": -2.5}, 400, "presence_penalty"),
    ({"presence_penalty": "1"}, 400, "presence_penalty"),
    ({"frequency_penalty": 3}, 400, "frequency_penalty"),
    ({"repetition_penalty": -1}, 400, "repetition_penalty"),
    ({"min_tokens": "1"}, 400, "min_tokens"),
    ({"messages": []}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": [None]}, 400, "messages[0]"),
    ({"messages": [{}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),  # a user turn needs its content
    ({"messages": [{"role": "system", "content": None}]}, 400, "messages[0].content"),
    ({"logit_bias": {"abc": 5}}, 400, "logit_bias"),  # known to OpenAI, not honoured here: refused
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": {"text": "x"}}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].tool_call_id"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "c"}]}, 400, "messages[0].role"),  # no call before
    ({"model": 5}, 400, "model"),
    ({"model": ""}, 404, "model"),
    ({"model": "gpt-4o"}, 404, "model"),
    ({"stream": 1}, 400, "stream"),
    ({"stream": True, "n": 0}, 400, "n"),
    ({"stream_options": "usage"}, 400, "stream_options"),
    ({"response_format": {"type": "json_object"}}, 400, "messages"),  # JSON mode, but no message says JSON
    ({"response_format": {"type": "json_schema"}}, 400, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string"}}}}, 400,
     "response_format.json_schema.schema"),
    ({"response_format": {"type": 3}}, 400, "response_format.type"),
    ({"stop": ["ok", ""]}, 400, "stop[1]"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options"),  # without stream: as OpenAI
    ({"tools": "x"}, 400, "tools"),
    ({"logprobs": "yes"}, 400, "logprobs"),
    ({"top_logprobs": 3}, 400, "top_logprobs"),  # needs logprobs: true
    ({"logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ({"user": 5}, 400, "user"),
    # vLLM extras the engine does not honour (found by QA: ignored as unknown fields, free text came back)
    ({"guided_choice": ["yes", "no"]}, 400, "guided_choice"),
    ({"guided_json": "{"}, 400, "guided_json"),  # (a schema is served: test_api_json_mode)
    ({"structured_outputs": {"choice": ["a"]}}, 400, "structured_outputs"),
    ({"min_p": 0.99}, 400, "min_p"),
    ({"use_beam_search": True}, 400, "use_beam_search"),
    ({"include_stop_str_in_output": True}, 400, "include_stop_str_in_output"),
    ({"prompt_logprobs": 21}, 400, "prompt_logprobs"),  # vLLM's field: 0 to 20
    ({"prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs"),  # not streamed, as vLLM answers
    ({"echo": True}, 400, "echo"),
    ({"continue_final_message": True}, 400, "continue_final_message"),
    ({"add_generation_prompt": False}, 400, "add_generation_prompt"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": True}}, 400,
     "stream_options.continuous_usage_stats"),
    ({"chat_template": "{{ messages }}"}, 400, "chat_template"),  # found by QA in a second pass
    ({"chat_template_kwargs": {"enable_thinking": True}}, 400, "chat_template_kwargs"),
    ({"skip_special_tokens": False}, 400, "skip_special_tokens"),
    ({"return_tokens_as_token_ids": True}, 400, "return_tokens_as_token_ids"),
    ({"logits_processors": ["x"]}, 400, "logits_processors"),
    ({"documents": [{"text": "x"}]}, 400, "documents"),
    ({"detokenize": False}, 400, "detokenize"),
]


_client: httpx.Client | None = None  # one keep-alive connection for the whole file


@pytest.fixture(scope="module", autouse=True)
def _shared_client():  # noqa: ANN202
    global _client
    _client = httpx.Client(timeout=60)
    yield
    _client.close()


def _post(api, path: str, *, json=None, content: bytes | None = None, headers: dict | None = None,  # noqa: ANN001
          auth: bool = True) -> httpx.Response:
    h = {"authorization": f"Bearer {api.key}"} if auth else {}
    h.update(headers or {})
    return _client.post(api.base_url + path, json=json, content=content, headers=h)


@pytest.mark.parametrize(("fields", "status", "param"), CHAT_CASES)
def test_hostile_chat_fields(api, fields, status, param) -> None:  # noqa: ANN001
    body = {"model": api.model, **BASE, **fields}
    if fields.get("model", "") is None:
        body.pop("model")
    assert_error(_post(api, "/v1/chat/completions", json=body), status, param=param)


@pytest.mark.parametrize(("fields", "param", "code"), [
    ({"min_p": "x"}, "min_p", "invalid_type"),  # found by QA: unsupported_parameter, as if a feature
    ({"use_beam_search": "yes"}, "use_beam_search", "invalid_type"),
    ({"bad_words": "x"}, "bad_words", "invalid_type"),
    ({"tool_choice": 1}, "tool_choice", "invalid_type"),
    ({"priority": True}, "priority", "invalid_type"),  # a boolean is not the number 0
    ({"min_p": 0.5}, "min_p", "unsupported_parameter"),  # the right type, a value not honoured
    ({"prompt_logprobs": "x"}, "prompt_logprobs", "invalid_type"),  # (served now: an integer field)
])
def test_refused_extras_of_the_wrong_type_say_so(api, fields, param, code) -> None:  # noqa: ANN001
    assert_error(_post(api, "/v1/chat/completions", json={"model": api.model, **BASE, **fields}), 400,
                 param=param, code=code)


@pytest.mark.parametrize("fields", [
    {"presence_penalty": 0, "frequency_penalty": 0.0},  # zero penalties are accepted (no-ops)
    {"presence_penalty": 0.5, "frequency_penalty": -1.0},  # and so are non-zero ones, within [-2, 2]
    {"presence_penalty": -2, "frequency_penalty": 2},
    {"seed": -1},
    {"seed": 2**64 - 1},
    {"top_k": 10**12},  # wider than the vocabulary: no top-k
    {"stop": ["x" * 10_000]},
    {"unknown_field": [1, {"x": None}]},  # unknown fields are ignored
    {"store": False, "metadata": {"team": "web"}, "service_tier": "auto", "parallel_tool_calls": True},
    {"messages": [{"role": "assistant"}, {"role": "user", "content": "x"}]},  # an assistant turn without content
    # vLLM extras at values that ask for nothing (what clients that send every default send)
    {"min_p": 0, "use_beam_search": False, "include_stop_str_in_output": False, "guided_json": None,
     "length_penalty": 1.0, "echo": False, "add_generation_prompt": True, "continue_final_message": False,
     "bad_words": [], "stream": False, "skip_special_tokens": True, "chat_template_kwargs": {}, "priority": 0,
     "detokenize": True, "return_token_ids": False},
    # a number equal to the neutral one, of the other numeric type (found by QA: priority 0.0 was refused)
    {"priority": 0.0, "min_p": 0.0, "length_penalty": 1},
    # tools turned off by their choice, as agent frameworks send them (found by QA: it was a 400)
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
     "tool_choice": "none"},
    {"functions": [{"name": "f", "parameters": {}}], "function_call": "none"},
])
def test_odd_but_valid_chat_fields_are_served(api, fields) -> None:  # noqa: ANN001
    resp = _post(api, "/v1/chat/completions", json={"model": api.model, **BASE, **fields})
    assert resp.status_code == 200, resp.text
    assert resp.json()["object"] == "chat.completion"


@pytest.mark.parametrize(("content", "headers"), [
    (b"", {}),
    (b"null", {}),
    (b"[]", {}),
    (b"42", {}),
    (b'"a string"', {}),
    (b"\xff\xfe\x00{not utf-8", {}),
    (b'{"model": "m", "messages": [', {}),  # truncated
    (b"[" * 50_000, {}),  # nesting deeper than the JSON parser's recursion limit
    (b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "x"}]}', {}),
    (b'{"model": "m", "top_p": Infinity, "messages": [{"role": "user", "content": "x"}]}', {}),
    (b'{"model": "m", "seed": ' + b"9" * 5000 + b', "messages": [{"role": "user", "content": "x"}]}', {}),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}', {"content-type": "text/plain"}),
    (b"model=m&messages=x", {"content-type": "application/x-www-form-urlencoded"}),
])
def test_broken_bodies(api, content, headers) -> None:  # noqa: ANN001
    h = {"content-type": "application/json", **headers}
    resp = _post(api, "/v1/chat/completions", content=content, headers=h)
    err = assert_error(resp, 400)
    if content == b"":  # no JSON to read (a QA find: it was invalid_type, as for a JSON array)
        assert err["code"] == "invalid_json" and "empty" in err["message"], err
    elif content == b"[]":
        assert err["code"] == "invalid_type", err


@pytest.mark.parametrize(("path", "encoding"), [
    ("/v1/chat/completions", "gzip"), ("/v1/completions", "br"), ("/v1/embeddings", "deflate"),
    ("/admin/v1/tenants", "gzip"), ("/v1/chat/completions", "identity, gzip"),
])
def test_a_compressed_body_is_415(api, path, encoding) -> None:  # noqa: ANN001
    """Found by QA: a gzip body was read as JSON and refused as 400 ``invalid_json``, which sent the
    client looking for a JSON mistake; it is 415 ``unsupported_content_encoding`` now, and a body
    marked ``identity`` is served."""
    import gzip
    import json

    body = {"model": api.model, **BASE} if "chat" in path else {"model": api.model, "prompt": "Hi", "max_tokens": 1}
    if path.endswith("embeddings"):
        body = {"model": "all-MiniLM-L6-v2", "input": "Hi"}
    elif path.startswith("/admin"):
        body = {"name": "never-made"}
    resp = _post(api, path, content=gzip.compress(json.dumps(body).encode()),
                 headers={"content-type": "application/json", "content-encoding": encoding})
    err = assert_error(resp, 415, code="unsupported_content_encoding")
    assert encoding in err["message"]
    served = _post(api, "/v1/chat/completions", content=json.dumps({"model": api.model, **BASE}).encode(),
                   headers={"content-type": "application/json", "content-encoding": "identity"})
    assert served.status_code == 200, served.text


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Basic dXNlcjpwYXNz", "bearer pg-", "Bearer pg-" + "a" * 43,
    "Bearer " + "x" * 6000, "Bearer pg-\u00e9\u00e8", "Token abc", "Bearer  pg-  spaced",
])
def test_broken_auth_is_401(api, authorization) -> None:  # noqa: ANN001
    headers = {} if authorization is None else {"authorization": authorization.encode("utf-8")}  # raw bytes
    resp = _post(api, "/v1/chat/completions", json={"model": api.model, **BASE}, headers=headers, auth=False)
    err = assert_error(resp, 401, code="invalid_api_key")
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/admin/v1/tenants"])
def test_two_authorization_headers_are_refused(api, path) -> None:  # noqa: ANN001
    """Found by QA: the first of two Authorization headers won, so a client could put its own before
    one a proxy adds. One credential a request: either order is a 400."""
    bad = "Bearer pg-" + "A" * 43
    for first, second in ((f"Bearer {api.key}", bad), (bad, f"Bearer {api.key}")):
        headers = [("authorization", first), ("authorization", second), ("content-type", "application/json")]
        method = "POST" if path.endswith("completions") else "GET"
        resp = httpx.request(method, api.base_url + path, headers=headers, timeout=60,
                             json={"model": api.model, **BASE} if method == "POST" else None)
        assert_error(resp, 400, code="duplicate_authorization_header")


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": [10**12]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": [[1], [-2]]}, "prompt[1]"),  # a batch: the bad one named
    ({"prompt": []}, "prompt"),
    ({"prompt": [[]]}, "prompt[0]"),  # a batch of one: its prompt named
    ({"prompt": 5}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": "x", "best_of": 0}, "best_of"),
    ({"prompt": "x", "best_of": -3}, "best_of"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),  # 0 only with echo (the prompt scored)
    ({"prompt": "x", "max_tokens": -1, "echo": True}, "max_tokens"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "max_tokens": 10**9}, "prompt"),
    ({"prompt": "x", "presence_penalty": 2.01}, "presence_penalty"),
    ({"prompt": "x", "guided_regex": "[ab]"}, "guided_regex"),  # vLLM extras not honoured
    ({"prompt": "x", "min_p": 0.1}, "min_p"),
    ({"prompt": "x", "allowed_token_ids": [1, 2]}, "allowed_token_ids"),
])
def test_hostile_completions(api, body, param) -> None:  # noqa: ANN001
    resp = _post(api, "/v1/completions", json={"model": api.model, "max_tokens": 1, **body})
    assert_error(resp, 404 if param == "model" else 400, param=param)


def test_best_of_below_one_is_a_wrong_value_and_above_unsupported(api) -> None:  # noqa: ANN001
    """Found by QA: ``best_of: 0`` was ``unsupported_parameter``, as if 0 were a feature missing."""
    for best_of, code in ((0, "invalid_value"), (-1, "invalid_value"), (2, "unsupported_parameter")):
        resp = _post(api, "/v1/completions", json={"model": api.model, "max_tokens": 1, "prompt": "x",
                                                  "best_of": best_of})
        assert_error(resp, 400, param="best_of", code=code)


@pytest.mark.parametrize(("body", "param"), [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["a", ""]}, "input[1]"),  # found by QA: named "input", where completions name prompt[i]
    ({"input": [1, "a"]}, "input[1]"),
    ({"input": [[1, 2], []]}, "input[1]"),
    ({"input": [True]}, "input[0]"),
    ({"input": ["a"] * 3000}, "input"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "dimensions": 100_000}, "dimensions"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": None}, "input"),
])
def test_hostile_embeddings(api, body, param) -> None:  # noqa: ANN001
    resp = _post(api, "/v1/embeddings", json={"model": "all-MiniLM-L6-v2", **body})
    assert_error(resp, 400, param=param)


@pytest.mark.parametrize("ids", [[1, 2, 3], [[1, 2], [3]]])
def test_token_id_input_to_embeddings_is_refused_by_name(api, ids) -> None:  # noqa: ANN001
    """OpenAI's other two input shapes: refused as unsupported, saying to send text (they were
    'should be a valid string' at input[0]); through the official client, as apps send them."""
    with pytest.raises(openai.BadRequestError) as caught:
        api.openai().embeddings.create(model="all-MiniLM-L6-v2", input=ids)
    err = caught.value.body
    assert (err["code"], err["param"]) == ("unsupported_parameter", "input"), err
    assert "Token ids" in err["message"] and "send the text" in err["message"]


def test_wrong_routes_and_methods(api) -> None:  # noqa: ANN001
    h = {"authorization": f"Bearer {api.key}"}
    assert_error(httpx.get(api.base_url + "/v1/chat/completions", headers=h, timeout=30), 405)
    assert_error(httpx.post(api.base_url + "/v1/nope", headers=h, json={}, timeout=30), 404)
    assert_error(httpx.get(api.base_url + "/v1/models/" + "x" * 3000, headers=h, timeout=30), 404,
                 code="model_not_found")


def test_engine_survives_the_hostile_requests(api) -> None:  # noqa: ANN001
    """Runs last in this file: after all of the above the engine still serves (a bad token id
    that reached the sampler would have killed its step loop for every tenant)."""
    assert httpx.get(api.base_url + "/health", timeout=30).status_code == 200
    resp = _post(api, "/v1/chat/completions", json={"model": api.model, **BASE, "min_tokens": 1,
                                                     "stop_token_ids": [2]})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 1


def test_the_openapi_document_is_served_and_no_cdn_pages(api) -> None:  # noqa: ANN001
    """Found by QA: /docs and /redoc were served, undocumented, with scripts from a CDN."""
    spec = httpx.get(api.base_url + "/openapi.json", timeout=30)
    assert spec.status_code == 200 and "/v1/chat/completions" in spec.json()["paths"]
    for page in ("/docs", "/redoc"):
        assert_error(httpx.get(api.base_url + page, timeout=30), 404, code="not_found")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_a_body_that_cannot_be_read_takes_no_request_from_the_window(api, path) -> None:  # noqa: ANN001
    """Found by QA: no body, or a JSON body sent as text/plain, was refused with 400 ``invalid_json``
    after the rate limit had taken a request, so the same mistake soon read as a 429 (and used up
    the window of the valid requests after it); malformed JSON already took none."""
    _tenant, key = api.make_tenant(rpm=2)
    h = {"authorization": f"Bearer {key}"}
    good = ({"model": "all-MiniLM-L6-v2", "input": "Hi"} if path.endswith("embeddings") else
            {"model": api.model, "prompt": "Hi", "max_tokens": 1} if path == "/v1/completions" else
            {"model": api.model, **BASE})
    import json

    for _ in range(3):
        assert_error(_client.post(api.base_url + path, content=json.dumps(good).encode(),
                                  headers={**h, "content-type": "text/plain"}), 400, code="invalid_json")
        assert_error(_client.post(api.base_url + path, headers=h), 400)
        assert_error(_client.post(api.base_url + path, content=b'{"model":', headers={**h, "content-type":
                                                                                    "application/json"}), 400)
    # and without a key, the key's refusal first (401 before 400)
    assert_error(_client.post(api.base_url + path, headers={"content-type": "text/plain"}, content=b"x"), 401)
    for _ in range(2):
        resp = _client.post(api.base_url + path, json=good, headers=h)
        assert resp.status_code == 200, resp.text
    assert_error(_client.post(api.base_url + path, json=good, headers=h), 429)


_SURROGATE = '"\\ud800"'  # JSON's escape of a lone surrogate (httpx would refuse to encode the str)


@pytest.mark.parametrize(("path", "template", "param"), [
    ("/v1/chat/completions", '{"model":"M","messages":[{"role":"user","content":[{"type":S}]}]}', "messages[0].content[0].type"),
    ("/v1/chat/completions", '{"model":"M","messages":[{"role":"user","content":"hi"}],"tool_choice":S}', "tool_choice"),
    ("/v1/chat/completions", '{"model":"M","messages":[{"role":"user","content":"hi"}],"function_call":S}', "function_call"),
    ("/v1/chat/completions", '{"model":"M","messages":[{"role":"user","content":"hi"}],"response_format":{"type":S}}',
     "response_format.type"),
    ("/v1/completions", '{"model":"M","prompt":"a","response_format":{"type":S}}', "response_format.type"),
])
def test_a_quoted_value_is_cut_and_a_lone_surrogate_escaped(api, path, template, param) -> None:  # noqa: ANN001
    """Found by a fuzzing QA: these errors quoted the value whole: a lone surrogate made the JSON
    answer a 500, and a 1 MB value came back whole. It is cut to 256 characters, the surrogate
    written as its escape."""
    body = template.replace('"M"', f'"{api.model}"')
    resp = _post(api, path, content=body.replace("S", _SURROGATE).encode(), headers={"content-type": "application/json"})
    err = assert_error(resp, 400, param=param)
    assert "\\ud800" in err["message"]
    resp = _post(api, path, content=body.replace("S", '"' + "A" * 1_000_000 + '"').encode(),
                 headers={"content-type": "application/json"})
    assert_error(resp, 400, param=param)
    assert len(resp.content) < 2_000 and "(1000000 characters)" in resp.json()["error"]["message"]


def test_a_made_up_key_is_cut_in_param_and_message(api) -> None:  # noqa: ANN001
    """Found by QA: a 1 MB ``metadata`` key came back twice (``message`` and ``param``): 2 MB."""
    body = {"model": api.model, **BASE, "metadata": {"A" * 1_000_000: "v"}}
    resp = _post(api, "/v1/chat/completions", json=body)
    assert resp.status_code == 400 and len(resp.content) < 2_000, resp.content[:300]
    assert resp.json()["error"]["param"].startswith("metadata.AAAA")


def test_a_chat_of_too_many_json_objects_is_refused_before_validation(api) -> None:  # noqa: ANN001
    """Found by QA: 250,000 content parts (7.8 MB) held the event loop 1.2 s in validation alone.
    Past 16,384 objects a chat is refused by a parse that stops there; braces inside text count
    for nothing."""
    parts = [{"type": "text", "text": "a"}] * 20_000
    body = {"model": api.model, "max_tokens": 1, "messages": [{"role": "user", "content": parts}]}
    err = assert_error(_post(api, "/v1/chat/completions", json=body), 400, param="messages")
    assert "16,384 JSON objects" in err["message"]
    many = [{"role": "user", "content": "a"}] * 17_000
    assert_error(_post(api, "/v1/chat/completions", json={"model": api.model, "messages": many}), 400,
                 param="messages")
    text = '{"k": {"v": 1}} ' * 5_000  # 10,000 braces of text, in a prompt of ~60,000 characters
    resp = _post(api, "/v1/chat/completions", json={"model": api.model, "max_tokens": 1,
                                                     "messages": [{"role": "user", "content": text}]})
    assert resp.status_code == 400 and "JSON objects" not in resp.text  # too long for the context, not that
    assert _post(api, "/v1/chat/completions", json={"model": api.model, **BASE}, auth=False).status_code == 401
    resp = _post(api, "/v1/chat/completions", json=body, auth=False)  # the key is checked first: 401
    assert resp.status_code == 401
