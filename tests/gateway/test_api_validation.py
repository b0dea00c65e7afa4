"""Request validation and error shapes over HTTP (httpx against the live gateway): bad input is a
400 OpenAI error naming the field, never a 500; every response carries x-request-id."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow  # the session's gateway holds the real engine


def post(api, path: str, body=None, *, key: str | None = None, content: bytes | None = None,  # noqa: ANN001
         headers: dict | None = None) -> httpx.Response:
    h = {"authorization": f"Bearer {key or api.key}", **(headers or {})}
    if content is not None:
        return httpx.post(api.base_url + path, content=content, headers=h, timeout=60)
    return httpx.post(api.base_url + path, json=body, headers=h, timeout=60)


def chat(api, **fields) -> dict:  # noqa: ANN001
    body = {"model": api.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    body.update(fields)
    return body


def assert_error(resp: httpx.Response, status: int, *, param: str | None = "<any>", code: str | None = "<any>") -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.headers["x-request-id"].startswith("req_")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and "Traceback" not in err["message"]
    if param != "<any>":
        assert err["param"] == param, err
    if code != "<any>":
        assert err["code"] == code, err
    return err


@pytest.mark.parametrize(("fields", "param"), [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"n": 0}, "n"),
    ({"n": 1.5}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"stop": 3}, "stop"),
    ({"seed": "x"}, "seed"),
    ({"top_k": "4"}, "top_k"),
    ({"min_tokens": -2}, "min_tokens"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"stop_token_ids": ["a"]}, "stop_token_ids[0]"),
    ({"ignore_eos": "no"}, "ignore_eos"),
    ({"stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": "hello"}, "messages"),
    ({"model": 7}, "model"),
])
def test_wrong_fields_are_400_with_param(api, fields, param) -> None:  # noqa: ANN001
    assert_error(post(api, "/v1/chat/completions", chat(api, **fields)), 400, param=param)


def test_an_unknown_role_lists_the_roles_served(api) -> None:  # noqa: ANN001
    err = assert_error(post(api, "/v1/chat/completions", chat(api, messages=[{"role": "wizard", "content": "x"}])),
                       400, param="messages[0].role")
    assert "'system', 'developer', 'user', 'assistant' or 'tool'" in err["message"] and "function" not in err["message"]
    err = assert_error(post(api, "/v1/chat/completions", chat(api, messages=[{"role": 5, "content": "x"}])),
                       400, param="messages[0].role")
    assert "'system', 'developer', 'user', 'assistant' or 'tool'" in err["message"]
    err = assert_error(post(api, "/v1/chat/completions", chat(api, messages=[{"role": None, "content": "x"}])),
                       400, param="messages[0].role")
    assert err["message"].endswith("(got null).")  # the JSON sent, not Python's None


def test_missing_field_and_bad_json(api) -> None:  # noqa: ANN001
    body = chat(api)
    del body["messages"]
    err = assert_error(post(api, "/v1/chat/completions", body), 400, param="messages",
                       code="missing_required_parameter")
    assert "messages" in err["message"]
    assert_error(post(api, "/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"}),
                 400, code="invalid_json")
    assert_error(post(api, "/v1/chat/completions", content=b"[1, 2]", headers={"content-type": "application/json"}),
                 400, param=None)


def test_unsupported_features_are_400(api) -> None:  # noqa: ANN001
    assert_error(post(api, "/v1/chat/completions", chat(api, top_logprobs=2)), 400, param="top_logprobs")
    unsupported = [  # known OpenAI features this model cannot serve: one code an app can branch on
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}}}),
         "response_format.json_schema.schema"),
        (dict(messages=[{"role": "function", "name": "f", "content": "r"}]), "messages[0].role"),
        (dict(messages=[{"role": "user", "content": [{"type": "text", "text": "Look:"},
                                                     {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
         "messages[0].content[1].type"),
    ]
    for fields, param in unsupported:
        assert_error(post(api, "/v1/chat/completions", chat(api, **fields)), 400, param=param,
                     code="unsupported_parameter")
    for field in ("tool_choice", "function_call"):  # a string naming no mode is a bad value, not a feature (QA)
        err = assert_error(post(api, "/v1/chat/completions", chat(api, **{field: "bogus"})), 400, param=field,
                           code="invalid_value")
        assert "'auto'" in err["message"], err
        # auto without tools: tool_choice needs tools (as OpenAI answers it); function_call is not served
        assert_error(post(api, "/v1/chat/completions", chat(api, **{field: "auto"})), 400, param=field,
                     code="invalid_value" if field == "tool_choice" else "unsupported_parameter")
    body = {"model": api.model, "prompt": ["one", "two"], "max_tokens": 1, "suffix": "!"}
    assert_error(post(api, "/v1/completions", body), 400, param="suffix", code="unsupported_parameter")
    # vLLM's completions take response_format too (found by QA: it was ignored, free text came back)
    body = {"model": api.model, "prompt": "hello", "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}}}
    assert_error(post(api, "/v1/completions", body), 400, param="response_format.json_schema.schema",
                 code="unsupported_parameter")
    body = {"model": api.model, "prompt": "hello", "max_tokens": 1, "response_format": {"type": "text"}}
    assert post(api, "/v1/completions", body).status_code == 200
    assert_error(post(api, "/v1/completions", {"model": api.model, "prompt": [-1, 5]}), 400, param="prompt")
    assert_error(post(api, "/v1/completions", {"model": api.model, "prompt": ""}), 400, param="prompt")


def test_context_length_exceeded(api) -> None:  # noqa: ANN001
    long_text = "hello " * 3000  # > 2048 tokens (the test engine's max_model_len)
    err = assert_error(post(api, "/v1/chat/completions", chat(api, messages=[{"role": "user", "content": long_text}])),
                       400, param="messages", code="context_length_exceeded")
    assert "maximum context length is 2048" in err["message"]
    # a prompt that fills the context: the requested completion is named (found by QA: the message
    # read "context 2048 ... your messages resulted in 2048 tokens"), and without one, the room it lacks
    assert "1 in the completion" in err["message"], err
    body = chat(api, messages=[{"role": "user", "content": long_text}])
    del body["max_tokens"]
    err = assert_error(post(api, "/v1/chat/completions", body), 400, param="messages", code="context_length_exceeded")
    assert "leaves no room for a completion" in err["message"], err
    err = assert_error(post(api, "/v1/chat/completions", chat(api, max_tokens=5000)), 400, param="messages",
                       code="context_length_exceeded")
    assert "5000 in the completion" in err["message"]


def test_more_messages_than_the_context_holds_are_refused_before_rendering(api) -> None:  # noqa: ANN001
    """Found by QA: empty messages have no characters, so 250,000 of them passed the size check and the
    chat template rendered them on the event loop for 3-9 s before the 400. Each message adds the
    template's special tokens (2 for ChatML), whatever it holds."""
    many = [{"role": "user", "content": ""}] * 1025  # at least 2050 tokens > 2048
    err = assert_error(post(api, "/v1/chat/completions", chat(api, messages=many)), 400, param="messages",
                       code="context_length_exceeded")
    assert "1,025 messages resulted in at least 2,050 tokens" in err["message"], err
    # fewer that still do not fit once rendered: the usual 400 after tokenizing (off the event loop)
    err = assert_error(post(api, "/v1/chat/completions", chat(api, messages=many[:900])), 400, param="messages",
                       code="context_length_exceeded")
    assert "4525 in the messages" in err["message"], err  # (900 turns of 5 tokens, and the system prompt)


def test_auth_and_model_errors(api) -> None:  # noqa: ANN001
    resp = httpx.post(api.base_url + "/v1/chat/completions", json=chat(api), timeout=30)
    assert_error(resp, 401, code="invalid_api_key")
    # a key in the URL, or in another scheme, is told so (found by QA: "You didn't provide an API key.")
    resp = httpx.post(api.base_url + "/v1/chat/completions?api_key=pg-xyz", json=chat(api), timeout=30)
    assert "not read from the URL" in assert_error(resp, 401, code="invalid_api_key")["message"]
    resp = httpx.post(api.base_url + "/v1/chat/completions", json=chat(api), headers={"authorization": "Basic eDp5"},
                      timeout=30)
    assert "'Basic' scheme" in assert_error(resp, 401, code="invalid_api_key")["message"]
    assert_error(post(api, "/v1/chat/completions", chat(api), key="pg-" + "x" * 43), 401, code="invalid_api_key")
    assert_error(post(api, "/v1/chat/completions", chat(api, model="gpt-17")), 404, param="model",
                 code="model_not_found")
    # a huge name is quoted cut short (found by a security QA: a 4 MB name came back whole)
    err = assert_error(post(api, "/v1/chat/completions", chat(api, model="m" * 100_000)), 404, param="model",
                       code="model_not_found")
    assert len(err["message"]) < 400 and "(100000 characters)" in err["message"], err
    _tid, key = api.make_tenant(allowed_models=["some-other-model"])
    err = assert_error(post(api, "/v1/chat/completions", chat(api), key=key), 403)
    assert api.model in err["message"]
    # a model this key may use, on the wrong route: that route is named (found by QA: "does not exist",
    # though /v1/models lists it); for a key that may not use it, it still "does not exist"
    embedding = api.settings.embedding_model
    err = assert_error(post(api, "/v1/chat/completions", chat(api, model=embedding)), 404, param="model",
                       code="model_not_found")
    assert "served on /v1/embeddings" in err["message"], err
    err = assert_error(post(api, "/v1/embeddings", {"model": api.model, "input": "x"}), 404, param="model",
                       code="model_not_found")
    assert "served on /v1/chat/completions" in err["message"], err
    err = assert_error(post(api, "/v1/chat/completions", chat(api, model=embedding), key=key), 404)
    assert "does not exist" in err["message"], err
    assert_error(httpx.get(api.base_url + "/v1/nowhere", timeout=30), 404)
    assert_error(httpx.delete(api.base_url + "/v1/models", timeout=30), 405)


def test_a_trailing_slash_on_models_is_an_unknown_url(api) -> None:  # noqa: ANN001
    """``/v1/models/`` is not the model named "" (``model_not_found``) but an unknown URL, as
    ``/v1/chat/completions/`` is."""
    for path in ("/v1/models/", "/v1/chat/completions/"):
        resp = httpx.request("GET" if "models" in path else "POST", api.base_url + path,
                             headers={"authorization": f"Bearer {api.key}"}, json={}, timeout=30)
        assert_error(resp, 404, code="not_found")


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/v1/models", "GET, HEAD"),  # GET and HEAD are declared apart: Starlette named only one
    ("DELETE", "/v1/models/some-model", "GET, HEAD"),
    ("POST", "/health", "GET, HEAD"),
    ("GET", "/v1/chat/completions", "POST"),
    ("DELETE", "/admin/v1/tenants", "GET, HEAD, POST"),  # list and create: two routes, one path
    ("PUT", "/admin/login", "GET, HEAD, POST"),  # the admin surface's GETs answer HEAD as GET
])
def test_405_names_every_method_the_path_answers(api, method, path, allow) -> None:  # noqa: ANN001
    resp = httpx.request(method, api.base_url + path, headers={"authorization": f"Bearer {api.key}"}, timeout=30)
    assert_error(resp, 405)
    assert resp.headers["allow"] == allow


def test_the_admin_surface_answers_head_as_get_without_the_body(api) -> None:  # noqa: ANN001
    """Found by QA: HEAD on the admin API and the dashboard was a 405, where /v1/models and /health
    answered it (RFC 9110 9.3.2: the GET's status and headers, no body)."""
    for path, status in (("/admin/login", 200), ("/admin/tenants", 303), ("/admin/v1/tenants", 401),
                         ("/admin/v1/nope", 404)):
        got = httpx.get(api.base_url + path, timeout=30, follow_redirects=False)
        head = httpx.head(api.base_url + path, timeout=30, follow_redirects=False)
        assert got.status_code == head.status_code == status, path
        assert head.content == b"" and (got.content or status == 303), path
        assert head.headers.get("content-type") == got.headers.get("content-type"), path
        assert head.headers.get("location") == got.headers.get("location"), path
    assert "content-security-policy" in httpx.head(api.base_url + "/admin/login", timeout=30).headers


def test_null_means_the_default_where_openai_allows_null(api) -> None:  # noqa: ANN001
    """SDKs and proxies send unset optionals as ``null``: ``n``, ``stream`` and ``echo`` take their
    defaults, as ``temperature`` or ``max_tokens`` always did."""
    resp = post(api, "/v1/chat/completions", chat(api, n=None, stream=None, stream_options=None))
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["choices"]) == 1
    resp = post(api, "/v1/completions", {"model": api.model, "prompt": "Zebras hum quietly", "max_tokens": 1, "n": None,
                                         "stream": None, "echo": None})
    assert resp.status_code == 200, resp.text
    assert not resp.json()["choices"][0]["text"].startswith("Zebras hum")  # echo off: one token, not the prompt


def test_unknown_fields_are_ignored_and_headers_present(api) -> None:  # noqa: ANN001
    resp = post(api, "/v1/chat/completions", chat(api, frobnicate={"a": 1}, logit_bias={},
                                                  parallel_tool_calls=False, metadata={"x": "y"}))
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-request-id"].startswith("req_")
    for name in ("requests", "tokens"):
        for part in ("limit", "remaining", "reset"):
            assert f"x-ratelimit-{part}-{name}" in resp.headers
    assert resp.json()["object"] == "chat.completion"


def test_models_endpoints(api) -> None:  # noqa: ANN001
    h = {"authorization": f"Bearer {api.key}"}
    listing = httpx.get(api.base_url + "/v1/models", headers=h, timeout=30).json()
    ids = [m["id"] for m in listing["data"]]
    assert listing["object"] == "list" and api.model in ids and "all-MiniLM-L6-v2" in ids
    card = httpx.get(f"{api.base_url}/v1/models/{api.model}", headers=h, timeout=30).json()
    assert card["id"] == api.model and card["object"] == "model" and card["max_model_len"] == 2048
    assert_error(httpx.get(api.base_url + "/v1/models/nope", headers=h, timeout=30), 404, code="model_not_found")
    for alias in ("all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2"):  # as /v1/embeddings takes them
        card = httpx.get(f"{api.base_url}/v1/models/{alias}", headers=h, timeout=30)
        assert card.status_code == 200 and card.json()["id"] == "all-MiniLM-L6-v2", alias
    _tid, alias_key = api.make_tenant(allowed_models=["sentence-transformers/all-MiniLM-L6-v2"])  # found by QA
    by_alias = httpx.get(api.base_url + "/v1/models", headers={"authorization": f"Bearer {alias_key}"}, timeout=30)
    assert [m["id"] for m in by_alias.json()["data"]] == ["all-MiniLM-L6-v2"]
    for name in ("all-MiniLM-L6-v2", "all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2"):  # QA: the listed
        used = httpx.post(api.base_url + "/v1/embeddings", headers={"authorization": f"Bearer {alias_key}"},  # id was 403
                          json={"model": name, "input": "hi"}, timeout=60)
        assert used.status_code == 200, (name, used.text)
    _tid, key = api.make_tenant(allowed_models=["all-MiniLM-L6-v2"])
    limited = httpx.get(api.base_url + "/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=30).json()
    assert [m["id"] for m in limited["data"]] == ["all-MiniLM-L6-v2"]
    head = httpx.head(api.base_url + "/v1/models", headers=h, timeout=30)  # GET's status and headers, no body
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == "application/json"
    assert httpx.head(api.base_url + "/v1/models", timeout=30).status_code == 401
    assert httpx.head(f"{api.base_url}/v1/models/{api.model}", headers=h, timeout=30).status_code == 200
    assert httpx.head(api.base_url + "/v1/models/nope", headers=h, timeout=30).status_code == 404


def test_health_and_metrics(api) -> None:  # noqa: ANN001
    health = httpx.get(api.base_url + "/health", timeout=30)
    assert health.status_code == 200 and health.headers["x-request-id"]
    body = health.json()
    assert body["status"] == "ok" and body["model"] == api.model
    head = httpx.head(api.base_url + "/health", timeout=30)  # load balancers' checks
    assert head.status_code == 200 and head.content == b"" and head.headers["x-request-id"]
    assert body["engine"]["kv_blocks_total"] == 512
    metrics = httpx.get(api.base_url + "/metrics", timeout=30).json()
    assert metrics["uptime_s"] >= 0 and "prefix_hit_rate" in metrics["engine"]
    loop = metrics["event_loop"]  # gateway.loop_lag, watching the server's loop
    assert set(loop) == {"lag_ms_max_last_minute", "stalls_last_minute", "stalls_total", "stall_threshold_ms",
                         "lag_ms_worst"} and loop["stall_threshold_ms"] == 50.0


def test_an_assistant_refusal_is_read_as_its_text(api) -> None:  # noqa: ANN001
    """OpenAI's answers carry refusals (a ``refusal`` content part, or the message's ``refusal``
    field) and clients send the conversation back with them: the turn reads as that text."""
    def prompt_tokens(assistant: dict) -> int:
        resp = post(api, "/v1/chat/completions", chat(api, messages=[
            {"role": "user", "content": "Tell me a secret."}, {"role": "assistant", **assistant},
            {"role": "user", "content": "Why not?"}]))
        assert resp.status_code == 200, resp.text
        return resp.json()["usage"]["prompt_tokens"]

    plain = prompt_tokens({"content": "I can't share that."})
    assert prompt_tokens({"content": [{"type": "refusal", "refusal": "I can't share that."}]}) == plain
    assert prompt_tokens({"content": None, "refusal": "I can't share that."}) == plain
    assert prompt_tokens({"content": "I can't share that.", "refusal": None}) == plain
    assert prompt_tokens({"content": "x"}) != plain  # (the count does see the turn's text)
    assert_error(post(api, "/v1/chat/completions", chat(api, messages=[
        {"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}])), 400,
        param="messages[0].content[0].type", code="invalid_value")
    assert_error(post(api, "/v1/chat/completions", chat(api, messages=[
        {"role": "user", "content": "hi", "refusal": "no"}])), 400, param="messages[0].refusal")
    assert_error(post(api, "/v1/chat/completions", chat(api, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "refusal"}]}])), 400,
        param="messages[1].content[0].refusal")


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_a_number_that_is_not_finite_is_named_so(api, literal) -> None:  # noqa: ANN001
    """JSON's NaN and infinities (and a literal too big for a float) are "not a finite number", not
    "should be less than or equal to 2 (got nan)"."""
    body = (b'{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, '
            b'"temperature": %s}' % (api.model.encode(), literal))
    err = assert_error(post(api, "/v1/chat/completions", content=body, headers={"content-type": "application/json"}),
                       400, param="temperature")
    assert "finite number" in err["message"] and "less than" not in err["message"], err


def test_a_number_of_thousands_of_digits_is_named(api) -> None:  # noqa: ANN001
    """Valid JSON that Python's int() refuses (over 4,300 digits) is not "could not parse"."""
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "seed": %s}' % (
        api.model.encode(), b"9" * 5000)
    err = assert_error(post(api, "/v1/chat/completions", content=body, headers={"content-type": "application/json"}),
                       400, code="invalid_value")
    assert "digits" in err["message"] and "parse" not in err["message"]
    resp = post(api, "/v1/chat/completions", content=body, key="pg-" + "x" * 43,
                headers={"content-type": "application/json"})
    assert_error(resp, 401)  # a caller without a valid key learns nothing about its body
