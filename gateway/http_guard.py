"""Limits on a request's head (its request line and headers), which uvicorn's httptools protocol
does not have: a head larger than ``max_header_bytes`` gets 431 and the connection is closed, and
a connection that has not finished sending a head ``header_timeout_s`` after it opened (or after
its request began, or after the first byte that came once its last response was sent) gets 408, or
is closed quietly when it had begun no request (it sent nothing, or only line ends, or the rest of
a body refused before it was read). Found by QA: one connection sending a 60 MB header held
the event loop for 6 s (the parser joins the pieces of a value as they arrive), and 1,500 sockets
each trickling a header line every 5 s were kept open for ever, until the process ran out of file
descriptors.

A request's body gets the same time plus a second for each 16 KiB received (408 past it), and the
open connections are counted, per client address and for the process (429 / 503
``too_many_connections`` past ``max_connections_per_address`` / ``max_connections``): found by a
security QA, 20,000 idle sockets from one address took every file descriptor, and a key's holder
trickling a body byte every 5 s held connections for ever.

The head is counted by the bytes that arrive while it is incomplete, from the second read on (a
read that begins a request may also end the previous one's body), so a head is refused once it
passes the limit by at most one read of the socket (256 KiB). The body is not counted here: the
middleware limits it (``PAGEGATE_MAX_REQUEST_BYTES``).

The time limit costs no timer per request: the connections whose head is due sit in one set, and
one sweep a second (a quarter of the limit when that is shorter) closes those past it, so a
request pays a set insert and a removal (a timer armed and cancelled per request cost ~2-5 µs of
the event loop's time).

It also frames a response to an HTTP/1.0 request that has no ``content-length`` (a stream) by
closing the connection, as HTTP/1.0 does: httptools' protocol sent ``transfer-encoding: chunked``,
which RFC 9112 6.1 forbids for a 1.0 request, and a strict 1.0 client read the chunk sizes as data
(found by QA)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.middleware import new_request_id


def _reply(status: int, reason: str, message: str, code: str, kind: str = "invalid_request_error", *,
           retry_after_s: int | None = None) -> tuple[bytes, bytes]:
    """The head (before its ``x-request-id``) and the body of a refusal."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    retry = f"retry-after: {retry_after_s}\r\n" if retry_after_s is not None else ""
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nx-content-type-options: nosniff\r\n{retry}connection: close\r\n")
    return head.encode("latin-1"), body


class CloseDelimitedCycle(RequestResponseCycle):
    """An HTTP/1.0 request's cycle: a response without a ``content-length`` (no HEAD, 204 or 304)
    is sent as it comes and ends with the connection's close, no chunked framing."""

    _close_delimited = False

    async def send(self, message: Any) -> None:
        if not self.response_started:
            if (message["type"] == "http.response.start" and self.scope["method"] != "HEAD"
                    and message.get("status") not in (204, 304)
                    and not any(name.lower() == b"content-length" for name, _ in message.get("headers", ()))):
                self.chunked_encoding = False  # (not None: no transfer-encoding is added)
                self.keep_alive = False  # a "connection: close" header, and the close ends the body
                self._close_delimited = True
        elif self._close_delimited and message["type"] == "http.response.body" and not self.response_complete:
            if self.flow.write_paused and not self.disconnected:
                await self.flow.drain()
            if self.disconnected:
                return
            self.transport.write(message.get("body", b""))
            if not message.get("more_body", False):
                self.response_complete = True
                self.message_event.set()
                self.transport.close()
                self.on_response()
            return
        await super().send(message)


BODY_MIN_BYTES_PER_S = 16 * 1024  # a body's time: the head's limit, plus a second for each 16 KiB received


def guarded_protocol(max_header_bytes: int, header_timeout_s: float, *, max_connections: int | None = None,
                     max_connections_per_address: int | None = None,
                     trusted: Callable[[str], bool] = lambda _address: False) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with the limits; pass it as ``uvicorn.Config(http=...)``.
    ``max_connections``: open connections of this process beyond which a new one gets 503 and is
    closed; ``max_connections_per_address``: the same for one client address, 429 (``trusted``
    addresses, the proxies of ``PAGEGATE_FORWARDED_ALLOW_IPS``, are not counted)."""
    too_large = _reply(431, "Request Header Fields Too Large",
                       f"The request's headers are too large; the limit is {max_header_bytes:,} bytes.",
                       "request_header_too_large")
    too_slow = _reply(408, "Request Timeout",
                      f"The request's headers did not arrive within {header_timeout_s:g} s.", "request_timeout")
    body_too_slow = _reply(408, "Request Timeout",
                           f"The request's body did not arrive in time ({header_timeout_s:g} s, plus a second for each "
                           f"{BODY_MIN_BYTES_PER_S // 1024} KiB received).", "request_timeout")
    busy = _reply(503, "Service Unavailable", "The server has too many open connections; retry shortly.",
                  "too_many_connections", "server_error", retry_after_s=1)
    crowded = _reply(429, "Too Many Requests",
                     f"Too many open connections from your address (at most {max_connections_per_address}); "
                     "close some or reuse them.", "too_many_connections", "rate_limit_exceeded", retry_after_s=1)

    sweep_every_s = min(1.0, header_timeout_s / 4)
    due: set[GuardedHttpToolsProtocol] = set()  # connections whose head has not arrived yet
    bodies: set[GuardedHttpToolsProtocol] = set()  # connections whose request's body is still arriving
    sweeping: list[asyncio.TimerHandle] = []  # the sweep scheduled, if any
    open_by_address: dict[str, int] = {}
    counted = [0]  # open connections of this process

    def sweep(loop: asyncio.AbstractEventLoop) -> None:
        sweeping.clear()
        now = loop.time()
        for protocol in [p for p in due if now - p._head_since >= header_timeout_s]:
            protocol._head_timed_out()
        for protocol in [p for p in bodies if now >= p._body_due()]:
            protocol._body_timed_out(body_too_slow)
        if due or bodies:
            sweeping.append(loop.call_later(sweep_every_s, sweep, loop))

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = True  # nothing received yet: the first request's head is due
            self._head_bytes = 0
            self._head_since = 0.0
            self._read = 0  # bytes of the read being parsed
            self._body_since = 0.0
            self._body_bytes = 0
            self._address: str | None = None  # counted against its address's open connections

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            counted[0] += 1
            peer = transport.get_extra_info("peername")
            address = peer[0] if isinstance(peer, tuple) and peer else None
            if max_connections is not None and counted[0] > max_connections:
                self._refuse(busy)  # (found by a security QA: 20,000 idle sockets took every descriptor)
                return
            if max_connections_per_address is not None and address is not None and not trusted(address):
                self._address = address
                open_by_address[address] = open_by_address.get(address, 0) + 1
                if open_by_address[address] > max_connections_per_address:
                    self._refuse(crowded)
                    return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            bodies.discard(self)
            counted[0] -= 1
            if self._address is not None:
                left = open_by_address.pop(self._address) - 1
                if left:
                    open_by_address[self._address] = left
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            idle = self.cycle is None or self.cycle.response_complete  # no request being read
            # a read that begins a request while another is read may end that one's body: counted
            # only when the head is still incomplete after the next read (see above)
            counting = self._in_head or idle
            if self not in due and idle:
                # bytes after the last response that begin no request (a bare CRLF: httptools skips
                # it without on_message_begin, and uvicorn's keep-alive timer stops at every read)
                # start the clock too (found by QA: one CRLF every 3 s held a connection for good)
                self._arm()
            self._read = len(data)
            super().data_received(data)
            if counting and self._in_head and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > max_header_bytes:
                    self._refuse(too_large)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._head_bytes = 0
            if self not in due:  # (a clock started by bytes before it keeps running)
                self._arm()

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._disarm()
            # a head that ends in this read may be over the limit with it (found by QA: one of 100 KB
            # sent at once was served): measured exactly then, which costs nothing on small reads
            if self._head_bytes + self._read > max_header_bytes and (
                    len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers) > max_header_bytes):
                self._refuse(too_large)  # (and a URL past 64 KiB: httptools' parse_url would fail)
                return
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope and self.scope.get("http_version") == "1.0":
                cycle.__class__ = CloseDelimitedCycle  # (before its task first runs: it sends through this)
            # a body that does not arrive in time closes its connection too (found by a security QA:
            # a key's holder trickling a byte every 5 s held 3,000 connections open, then 20,000)
            self._body_since, self._body_bytes = self.loop.time(), 0
            bodies.add(self)  # (one that has no body leaves at on_message_complete, in this read)
            if not sweeping:
                sweeping.append(self.loop.call_later(sweep_every_s, sweep, self.loop))

        def on_body(self, body: bytes) -> None:
            if not self.transport.is_closing():  # (refused: the rest of this read is not served)
                self._body_bytes += len(body)
                super().on_body(body)

        def on_message_complete(self) -> None:
            bodies.discard(self)
            if not self.transport.is_closing():
                super().on_message_complete()

        def _body_due(self) -> float:
            return self._body_since + header_timeout_s + self._body_bytes / BODY_MIN_BYTES_PER_S

        def _body_timed_out(self, reply: tuple[bytes, bytes]) -> None:
            bodies.discard(self)
            if self.transport.is_closing():
                return
            cycle = self.cycle
            # told, unless the app has begun its answer; the app then reads a disconnect, and its
            # answer goes nowhere (uvicorn drops what is sent on a closed connection)
            self._refuse(reply if cycle is not None and not cycle.response_started else None)

        def _arm(self) -> None:
            self._head_since = self.loop.time()
            due.add(self)
            if not sweeping:
                sweeping.append(self.loop.call_later(sweep_every_s, sweep, self.loop))

        def _disarm(self) -> None:
            due.discard(self)

        def _head_timed_out(self) -> None:
            due.discard(self)
            if not self.transport.is_closing():
                # one in the middle of a head is told; one that sent nothing, or only bytes that begin
                # no request (line ends, the rest of a refused request's body), is closed quietly
                self._refuse(too_slow if self._in_head and self.scope is not None else None)

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to bytes that are not HTTP (a ``content-length`` next to a
            ``transfer-encoding``, two ``content-length``s, a folded header…): an OpenAI error object
            with a request id, as every refusal of the gateway (found by QA: it was text/plain)."""
            self._refuse(_reply(400, "Bad Request", f"{msg.rstrip('.')}: the request is not valid HTTP/1.1.",
                                "invalid_http_request"))

        def _refuse(self, reply: tuple[bytes, bytes] | None) -> None:
            self._in_head = False
            self._disarm()
            if reply:  # with a request id, as every response of the gateway has one
                head, body = reply
                self.transport.write(head + b"x-request-id: " + new_request_id().encode() + b"\r\n\r\n" + body)
            self.transport.close()

    return GuardedHttpToolsProtocol
