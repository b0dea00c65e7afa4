"""A request without a valid key is refused before its body is read: parsing a large body holds
the event loop (found by QA: four 8 MB chat bodies without a key held every other request for 6 s
before each got its 401). Each request here sends its head and a first slice of a large body, then
waits: the answer must come without the rest."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.slow  # the session's gateway holds the real engine


def _answer_to_a_partial_body(base_url: str, path: str, authorization: str | None) -> tuple[int, dict]:
    url = urlsplit(base_url)
    head = [f"POST {path} HTTP/1.1", f"host: {url.netloc}", "content-type: application/json",
            "content-length: 5000000"]
    if authorization is not None:
        head.append(f"authorization: {authorization}")
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b'{"messages": [' + b" " * 10_000)
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
            chunk = sock.recv(65536)  # a timeout here: the server waited for the rest of the body
            assert chunk, data
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.partition(b"\r\n\r\n")[2][:_length(data)])


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 1 << 30


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
@pytest.mark.parametrize("authorization", [None, "Bearer pg-" + "a" * 43, "Bearer sk-not-ours"])
def test_a_request_without_a_valid_key_is_refused_before_its_body(api, path, authorization) -> None:  # noqa: ANN001
    status, body = _answer_to_a_partial_body(api.base_url, path, authorization)
    assert status == 401 and body["error"]["code"] == "invalid_api_key", body


def test_a_disabled_tenant_is_refused_before_its_body(api) -> None:  # noqa: ANN001
    _tenant_id, key = api.make_tenant(enabled=False)
    status, body = _answer_to_a_partial_body(api.base_url, "/v1/chat/completions", f"Bearer {key}")
    assert status == 403 and body["error"]["code"] == "tenant_disabled", body


def test_a_valid_key_still_gets_its_body_judged(api) -> None:  # noqa: ANN001
    """The key checked early is the one the request is served with: same answers as before."""
    import httpx

    resp = httpx.post(api.base_url + "/v1/chat/completions", content=b'{"messages": [',
                      headers={"authorization": f"Bearer {api.key}", "content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    resp = httpx.post(api.base_url + "/v1/chat/completions", timeout=120,
                      json={"model": api.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
                      headers={"authorization": f"Bearer {api.key}"})
    assert resp.status_code == 200, resp.text
