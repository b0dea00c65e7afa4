"""Limits on a request's head (``gateway.http_guard``) and whom ``X-Forwarded-For`` is read from,
through uvicorn as ``pagegate serve`` configures it (``gateway.serve.uvicorn_options``)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import pytest
import uvicorn

from gateway.serve import uvicorn_options
from gateway.settings import Settings


async def _app(scope, receive, send) -> None:  # noqa: ANN001
    """Reads the whole body, answers 200 with the client address and the body's length."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    if scope["path"] == "/stream":  # a body of unknown length, in pieces (a server-sent event stream)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        return
    body = json.dumps({"client": scope["client"][0], "size": size}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def serve():  # noqa: ANN201
    servers = []
    saved = [(lg, list(lg.handlers), lg.propagate, lg.level)
             for lg in (logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "uvicorn.access"))]

    async def start(**settings) -> int:  # noqa: ANN003
        options = uvicorn_options(Settings(port=_free_port(), log_level="warning", **settings))
        server = uvicorn.Server(uvicorn.Config(_app, lifespan="off", **options))
        task = asyncio.ensure_future(server.serve())
        servers.append((server, task))
        while not server.started:
            assert not task.done()
            await asyncio.sleep(0.02)
        return options["port"]

    yield start
    for server, task in servers:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
    for lg, handlers, propagate, level in saved:
        lg.handlers[:] = handlers
        lg.propagate = propagate
        lg.setLevel(level)


async def _exchange(port: int, *pieces: bytes, pause_s: float = 0.0) -> tuple[int | None, bytes]:
    """Sends the pieces (``pause_s`` apart), reads until the server closes or 10 s pass: the
    status (None: closed without a reply) and the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            if pause_s:
                await asyncio.sleep(pause_s)
        data = b""
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), 10)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            if b"content-length:" in head.lower():
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
    finally:
        writer.close()
    if not data:
        return None, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _get(headers: bytes = b"") -> bytes:
    return b"GET / HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n"


async def test_a_head_over_the_limit_is_431_and_one_under_it_is_served(serve) -> None:  # noqa: ANN001
    port = await serve()
    status, body = await _exchange(port, _get(b"x-big: " + b"a" * 50_000 + b"\r\n"))
    assert status == 200, body
    # sent in pieces, as a client trickling a huge header does: refused once past the limit
    big = _get(b"x-big: " + b"a" * 2_000_000 + b"\r\n")
    started = time.monotonic()
    status, body = await _exchange(port, *(big[i:i + 16_384] for i in range(0, len(big), 16_384)))
    assert status == 431, body
    assert json.loads(body)["error"]["code"] == "request_header_too_large"
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("limit", [None, 8192])
async def test_a_head_over_the_limit_in_one_read_is_431(serve, limit) -> None:  # noqa: ANN001
    """Found by QA: a head over the limit that arrived in one read (100 KB at the default limit, 9 KB
    at 8 KiB) was served; only heads spread over several reads were counted."""
    port = await serve(**({} if limit is None else {"max_header_bytes": limit}))
    size = (limit or 65536) + 1000
    status, body = await _exchange(port, _get(b"x-big: " + b"a" * size + b"\r\n"))
    assert status == 431, body
    status, _ = await _exchange(port, _get(b"x-fits: " + b"a" * ((limit or 65536) - 500) + b"\r\n"))
    assert status == 200


async def test_a_long_url_is_431_too(serve) -> None:  # noqa: ANN001
    """Found by QA: a URL of 64-100 KB sent in one read got uvicorn's plain-text 400 (httptools'
    parse_url fails past 64 KiB) instead of the 431 in the error shape."""
    port = await serve()
    status, body = await _exchange(port, b"GET /?" + b"a" * 70_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    assert status == 431 and json.loads(body)["error"]["code"] == "request_header_too_large", body


async def test_a_refusal_carries_a_request_id(serve) -> None:  # noqa: ANN001
    port = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /?" + b"a" * 70_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 431") and b"\r\nx-request-id: req_" in head, head
    assert b"\r\nx-content-type-options: nosniff\r\n" in head, head  # as every other answer (found by QA)


@pytest.mark.parametrize("request_bytes", [
    b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
    b"GET / HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n folded\r\n\r\n",
    b"GET / HTTP/1.1\r\nhost: x\r\nx-a: 1\r2\r\n\r\n",
])
async def test_bytes_that_are_not_http_get_an_error_object_with_a_request_id(serve, request_bytes) -> None:  # noqa: ANN001
    """Found by QA: uvicorn answered these (rightly refused) requests with a text/plain 400 without
    ``x-request-id``; every refusal of the gateway is an OpenAI error object with one."""
    port = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request_bytes)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"\r\nx-request-id: req_" in head, data
    assert b"content-type: application/json" in head
    assert b"x-content-type-options: nosniff" in head
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_http_request" and "not valid HTTP" in error["message"]


async def test_a_large_body_in_the_heads_read_is_not_counted(serve) -> None:  # noqa: ANN001
    port = await serve(max_header_bytes=4096)
    body = b"x" * 300_000
    status, reply = await _exchange(port, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    assert status == 200 and json.loads(reply)["size"] == len(body), reply


async def test_a_head_that_does_not_finish_in_time_is_408(serve) -> None:  # noqa: ANN001
    port = await serve(header_timeout_s=0.5)
    started = time.monotonic()
    status, body = await _exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\n", b"x-slow: 1\r\n", pause_s=0.2)
    assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout", body
    assert 0.4 < time.monotonic() - started < 5
    # a connection that sends nothing is closed, without a reply
    status, _ = await _exchange(port)
    assert status is None
    # a head that finishes in time is served, and the connection's next request gets its own time
    status, _ = await _exchange(port, _get(), pause_s=0.7)
    assert status == 200


async def test_x_forwarded_for_is_read_only_from_the_proxies_named(serve) -> None:  # noqa: ANN001
    """Found by QA: uvicorn trusts X-Forwarded-For from 127.0.0.1 by default, so a local client
    chose the address the per-address limit counted."""
    forged = _get(b"x-forwarded-for: 10.9.8.7\r\n")
    port = await serve()
    status, body = await _exchange(port, forged)
    assert status == 200 and json.loads(body)["client"] == "127.0.0.1", body
    port = await serve(forwarded_allow_ips="127.0.0.1")
    status, body = await _exchange(port, forged)
    assert status == 200 and json.loads(body)["client"] == "10.9.8.7", body


async def test_bare_line_ends_after_a_response_do_not_keep_a_connection(serve) -> None:  # noqa: ANN001
    """Found by QA: after one request, a CRLF every few seconds held the connection for good
    (httptools skips it without beginning a message, and each read stopped uvicorn's keep-alive
    timer). The head's clock starts at the first such byte."""
    port = await serve(header_timeout_s=0.5)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_get())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 5:
            try:
                writer.write(b"\r\n")
                await writer.drain()
            except ConnectionError:
                closed = True
                break
            try:
                if await asyncio.wait_for(reader.read(65536), 0.2) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except ConnectionError:
                closed = True
                break
        assert closed and time.monotonic() - started < 3
    finally:
        writer.close()


async def test_a_stream_to_an_http_1_0_client_ends_with_the_connection_not_in_chunks(serve) -> None:  # noqa: ANN001
    """Found by QA: a stream to an HTTP/1.0 request came with ``transfer-encoding: chunked``, which
    RFC 9112 forbids for 1.0 (a strict client reads the chunk sizes as data); HTTP/1.1 keeps chunks."""
    port = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /stream HTTP/1.0\r\nhost: x\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)  # to the end: the server closes it
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
    assert b"connection: close" in head.lower()
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert b"transfer-encoding: chunked" in data.lower() and data.endswith(b"0\r\n\r\n")
    status, _ = await _exchange(port, b"GET / HTTP/1.0\r\nhost: x\r\n\r\n")  # a length: as before
    assert status == 200


async def _open_idle(port: int, n: int) -> list[asyncio.StreamWriter]:
    writers = []
    for _ in range(n):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(writer)
    await asyncio.sleep(0.1)  # (accepted by the server)
    return writers


async def test_one_address_may_hold_only_so_many_connections(serve) -> None:  # noqa: ANN001
    """Found by a security QA: 20,000 idle sockets from one client (no key needed) took every file
    descriptor, and nothing was answered, /health included. One address past
    PAGEGATE_MAX_CONNECTIONS_PER_ADDRESS gets 429 and its connection is closed; the others are
    served; a closed one frees its place."""
    port = await serve(max_connections_per_address=3)
    held = await _open_idle(port, 3)
    try:
        status, body = await _exchange(port, _get())
        assert status == 429 and json.loads(body)["error"]["code"] == "too_many_connections", body
        held.pop().close()
        await asyncio.sleep(0.1)
        status, _ = await _exchange(port, _get())
        assert status == 200
    finally:
        for writer in held:
            writer.close()


async def test_a_trusted_proxy_is_not_capped_per_address(serve) -> None:  # noqa: ANN001
    port = await serve(max_connections_per_address=2, forwarded_allow_ips="127.0.0.1")
    held = await _open_idle(port, 4)
    try:
        status, _ = await _exchange(port, _get())
        assert status == 200
    finally:
        for writer in held:
            writer.close()


async def test_past_the_process_s_connection_budget_a_connection_gets_503(serve, monkeypatch) -> None:  # noqa: ANN001
    import gateway.serve as serve_mod

    monkeypatch.setattr(serve_mod, "connection_budget", lambda: 3)
    port = await serve(max_connections_per_address=0)  # (0: no limit per address)
    held = await _open_idle(port, 3)
    try:
        status, body = await _exchange(port, _get())
        assert status == 503 and json.loads(body)["error"]["type"] == "server_error", body
    finally:
        for writer in held:
            writer.close()
    await asyncio.sleep(0.1)
    assert (await _exchange(port, _get()))[0] == 200


async def test_a_body_that_does_not_arrive_in_time_is_408(serve) -> None:  # noqa: ANN001
    """Found by a security QA: a key's holder sending its headers, then a byte every 5 s, held a
    connection for ever (3,000 of them after a minute). A body gets the head's time limit plus a
    second for each 16 KiB received; past it, 408 and the connection is closed."""
    port = await serve(header_timeout_s=0.5)
    started = time.monotonic()
    status, body = await _exchange(port, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n", b"x", b"y",
                                   pause_s=0.4)
    assert status == 408 and b"body did not arrive" in body, body
    assert 0.4 < time.monotonic() - started < 5
    # one that keeps coming faster than 16 KiB a second is served, however long it takes
    pieces = [b"z" * 4000] * 5
    status, body = await _exchange(port, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 20000\r\n\r\n", *pieces,
                                   pause_s=0.2)
    assert status == 200 and json.loads(body)["size"] == 20000, body
