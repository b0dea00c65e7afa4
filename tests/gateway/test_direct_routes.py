"""The two generation routes are served by the gateway's middleware (``gateway.routes.DIRECT``),
not by FastAPI's route machinery: they must answer every request exactly as FastAPI's declared
routes do. Each request below goes to the running gateway over HTTP and, in the same process, to
the same app with the direct routes switched off (FastAPI serving them); status and body must agree."""

from __future__ import annotations

import copy
import json

import httpx
import pytest

from gateway.middleware import GatewayMiddleware
from tests.gateway.test_api_hostile import BASE, CHAT_CASES

pytestmark = pytest.mark.slow  # the session's gateway holds the real engine

BROKEN = [
    b"", b"null", b"[]", b"42", b'"a string"', b"\xff\xfe\x00{not utf-8", b'{"model": "m", "messages": [',
    b"[" * 50_000, b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "m", "seed": ' + b"9" * 5000 + b', "messages": [{"role": "user", "content": "x"}]}',
    b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
]
CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "application/vnd.api+json", "text/plain",
                 "application/x-www-form-urlencoded", None]
COMPLETIONS = [{"prompt": "x"}, {"prompt": [1, 2]}, {"prompt": [10**12]}, {"prompt": None}, {"prompt": "x", "n": 0},
               {"prompt": "x", "echo": "yes"}, {"prompt": "x", "max_tokens": 10**9}, {}]


def _gateway_layer(app) -> GatewayMiddleware:  # noqa: ANN001
    layer = app.middleware_stack
    while not isinstance(layer, GatewayMiddleware):
        layer = layer.app
    return layer


def _fastapi_served(app):  # noqa: ANN001, ANN202
    """The app as it would be without direct routes (below Starlette's outermost error layer)."""
    plain = copy.copy(_gateway_layer(app))
    plain.direct = {}

    async def asgi(scope, receive, send):  # noqa: ANN001, ANN202
        scope["app"] = app
        await plain(scope, receive, send)

    return asgi


def _both(api, path: str, content: bytes, content_type: str | None, *, key: str | None = None):  # noqa: ANN001, ANN202
    headers = {"authorization": f"Bearer {key or api.key}"}
    if content_type is not None:
        headers["content-type"] = content_type
    direct = httpx.post(api.base_url + path, content=content, headers=headers, timeout=60)

    async def via_fastapi() -> httpx.Response:
        transport = httpx.ASGITransport(app=_fastapi_served(api.app), client=("127.0.0.1", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
            return await client.post(path, content=content, headers=headers)

    return direct, api.loop.run(via_fastapi())


def _same(direct: httpx.Response, fastapi: httpx.Response) -> None:
    assert direct.status_code == fastapi.status_code, (direct.text, fastapi.text)
    if direct.status_code != 200:
        assert direct.json() == fastapi.json()
    else:
        assert direct.json()["object"] == fastapi.json()["object"]
    assert direct.headers["content-type"] == fastapi.headers["content-type"]


@pytest.mark.parametrize(("fields", "status", "param"), CHAT_CASES[::3])
def test_chat_fields_answered_as_fastapi_answers(api, fields, status, param) -> None:  # noqa: ANN001
    content = json.dumps({"model": api.model, **BASE, **fields}).encode()
    direct, fastapi = _both(api, "/v1/chat/completions", content, "application/json")
    _same(direct, fastapi)
    assert direct.status_code == status and direct.json()["error"]["param"] == param


@pytest.mark.parametrize("content", BROKEN)
def test_broken_bodies_answered_as_fastapi_answers(api, content) -> None:  # noqa: ANN001
    _same(*_both(api, "/v1/chat/completions", content, "application/json"))


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
def test_content_types_answered_as_fastapi_answers(api, content_type) -> None:  # noqa: ANN001
    content = json.dumps({"model": api.model, **BASE}).encode()
    _same(*_both(api, "/v1/chat/completions", content, content_type))


def test_a_json_body_without_a_content_type_is_served(api) -> None:  # noqa: ANN001
    """Found by QA: ``requests.post(url, data=json.dumps(body))`` sends no content type, and the
    body was refused as not JSON; FastAPI's non-strict reading (and vLLM's) takes it as JSON."""
    content = json.dumps({"model": api.model, **BASE}).encode()
    direct, fastapi = _both(api, "/v1/chat/completions", content, None)
    assert direct.status_code == 200, direct.text
    _same(direct, fastapi)
    embedded = httpx.post(api.base_url + "/v1/embeddings", content=json.dumps({"model": api.settings.embedding_model, "input": "hi"}).encode(),
                          headers={"authorization": f"Bearer {api.key}"}, timeout=60)
    assert embedded.status_code == 200, embedded.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_a_body_of_another_content_type_is_told_so(api, path) -> None:  # noqa: ANN001
    """Found by QA: curl's ``-d`` sends a form's content type, and "We could not parse the JSON body"
    sent people to look for a mistake in their JSON. The refusal names the content type."""
    content = json.dumps({"model": api.model, **BASE}).encode()
    resp = httpx.post(api.base_url + path, content=content, timeout=60,
                      headers={"authorization": f"Bearer {api.key}", "content-type": "application/x-www-form-urlencoded"})
    err = resp.json()["error"]
    assert resp.status_code == 400 and err["code"] == "invalid_json", err
    assert "this request's is 'application/x-www-form-urlencoded'" in err["message"], err


@pytest.mark.parametrize("fields", COMPLETIONS)
def test_completions_answered_as_fastapi_answers(api, fields) -> None:  # noqa: ANN001
    content = json.dumps({"model": api.model, "max_tokens": 1, **fields}).encode()
    _same(*_both(api, "/v1/completions", content, "application/json"))


def test_a_bad_key_is_refused_before_the_body_is_read(api) -> None:  # noqa: ANN001
    for content in (b"{not json", b"[]", json.dumps({"model": api.model, **BASE}).encode()):
        direct, fastapi = _both(api, "/v1/chat/completions", content, "application/json", key="pg-wrong")
        _same(direct, fastapi)
        assert direct.status_code == 401


def test_the_middleware_serves_both_routes(api) -> None:  # noqa: ANN001
    """Not FastAPI: the direct handlers are what answer (counted), with the gateway's headers."""
    layer = _gateway_layer(api.app)
    served: list[str] = []
    original = dict(layer.direct)

    def counted(path: str):  # noqa: ANN202
        async def handler(request):  # noqa: ANN001, ANN202
            served.append(path)
            return await original[path](request)
        return handler

    layer.direct = {path: counted(path) for path in original}
    try:
        client = api.openai()
        client.chat.completions.create(model=api.model, messages=BASE["messages"], max_tokens=1)
        client.completions.create(model=api.model, prompt="x", max_tokens=1)
        resp = httpx.post(api.base_url + "/v1/chat/completions", json={"model": api.model, **BASE},
                          headers={"authorization": f"Bearer {api.key}"}, timeout=60)
    finally:
        layer.direct = original
    assert served == ["/v1/chat/completions", "/v1/completions", "/v1/chat/completions"]
    assert resp.status_code == 200 and resp.headers["x-request-id"].startswith("req_")
    assert set(original) == {"/v1/chat/completions", "/v1/completions"}


def test_the_key_then_the_body_then_the_limits(api) -> None:  # noqa: ANN001
    """The key is checked before the body is read (an oversized chunked body without a valid key is
    a 401, its body unread; with one, a 413), and a body that is not JSON is refused before it takes
    a request from the key's per-minute window, as FastAPI's order had it."""
    def chunks():  # noqa: ANN202 - no content-length: the limit counts what arrives
        for _ in range(3):
            yield b"x" * (api.settings.max_request_bytes // 2 + 1)

    resp = httpx.post(api.base_url + "/v1/chat/completions", content=chunks(), timeout=60,
                      headers={"authorization": "Bearer pg-wrong", "content-type": "application/json"})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    resp = httpx.post(api.base_url + "/v1/chat/completions", content=chunks(), timeout=60,
                      headers={"authorization": f"Bearer {api.key}", "content-type": "application/json"})
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    _, key = api.make_tenant(rpm=2)
    for _ in range(3):
        bad = httpx.post(api.base_url + "/v1/chat/completions", content=b"{not json", timeout=60,
                         headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    for _ in range(2):  # both requests of the window are still there
        ok = httpx.post(api.base_url + "/v1/chat/completions", json={"model": api.model, **BASE}, timeout=60,
                        headers={"authorization": f"Bearer {key}"})
        assert ok.status_code == 200, ok.text


def test_a_client_gone_mid_upload_is_no_server_error(api, caplog) -> None:  # noqa: ANN001
    layer = _gateway_layer(api.app)
    sent: list[dict] = []

    async def call() -> None:
        messages = [{"type": "http.request", "body": b'{"model": "m", "mess', "more_body": True},
                    {"type": "http.disconnect"}]

        async def receive() -> dict:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "app": api.app,
                 "headers": [(b"authorization", f"Bearer {api.key}".encode()), (b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "query_string": b"", "root_path": "", "scheme": "http",
                 "server": ("127.0.0.1", 80), "http_version": "1.1"}
        await layer(scope, receive, send)

    with caplog.at_level("ERROR"):
        api.loop.run(call())
    assert sent[0]["status"] == 400
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
