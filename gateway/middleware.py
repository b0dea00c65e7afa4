"""The gateway's one ASGI middleware, pure ASGI (no BaseHTTPMiddleware: it would buffer streams).
In this order, on every HTTP request:

- gives the request an id (``request.state.request_id``) and every response ``x-request-id``;
- adds ``request.state.response_headers`` (rate-limit, quota, cache headers set while the request
  is handled) to whatever response goes out, streams included;
- on ``/v1/*`` and ``/admin/*``, the per-client-address limit (``gateway.ip_limit``, when
  ``ip_rpm`` > 0): its 429s carry the request id;
- refuses bodies over ``PAGEGATE_MAX_REQUEST_BYTES`` with 413 ``request_too_large``: at once when
  ``content-length`` says so, else as soon as that much has arrived (without a limit a 100 MB
  body was parsed whole, and the process grew by 5 GB, before any check ran);
- on the ``/v1`` routes that take a body, checks the API key before the body is read (``KEY_FIRST``);
- serves ``direct`` routes itself (``POST /v1/chat/completions`` and ``/v1/completions``: see
  ``gateway.routes``); everything else goes on to FastAPI;
- withdraws the request's engine notice (``request.state.engine_notice``, taken once its key is
  known: ``gateway.deps``) when the request ends without reaching the engine (refused, failed);
- the catch-all: an exception nothing else handled becomes a 500 OpenAI error without traceback
  (logged with the request id). Bad input never gets here: it is a 400 from the handlers;
- keeps the tasks of requests not answered yet in ``unanswered``: a server shutting down
  (``gateway.shutdown``) cancels those still waiting near its graceful timeout (an embedding
  batch, a request stuck in admission), and each gets a 503 ``server_shutting_down`` here instead
  of uvicorn's plain-text 500; while the shutdown begins (``Unanswered.refusing``) new requests get
  that 503 at once.

And on start-up, a failure (the engine cannot load its weights: out of memory, a broken file) is
reported as its exception's line, not the whole traceback Starlette sends uvicorn (that one is
logged at DEBUG).

One layer instead of three: every layer of an ASGI stack is a coroutine call per request and a
``send`` wrapper per response message, on the event loop that admits every request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.error_handlers import error_response, http_error_response
from gateway.errors import ApiError, shutting_down
from gateway.ids import new_hex_id
from gateway.settings import is_loopback

log = logging.getLogger("pagegate.gateway")

INTERNAL_ERROR = {
    "error": {
        "message": "The server had an error while processing your request.",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
}

DirectRoute = Callable[[Request], Awaitable[Response]]

# the per-client-address limit covers these paths (the admin API and dashboard too: found by QA,
# two clients without a token posting to /admin slowed every tenant's requests)
LIMITED_PREFIXES = ("/v1/", "/admin/")
# POST routes whose API key is checked before their body is read: a body is parsed on the event
# loop, and an 8 MB one takes a second or more there (found by QA: four such bodies without a key
# held every other request for 6 s before each got its 401)
KEY_FIRST = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


async def _key_first(scope: Scope, authorization: bytes | None) -> ApiError | None:
    """The request's 401/403 before its body is read; its principal kept in ``scope["state"]``
    (``gateway.deps.authenticate_and_limit`` takes it from there). None while the app starts."""
    services = getattr(getattr(scope["app"].state, "pagegate", None), "services", None)
    if services is None:
        return None
    try:
        scope["state"]["principal"] = await services.auth.authenticate(
            authorization.decode("latin-1") if authorization is not None else None,
            query_string=scope.get("query_string", b""))
    except ApiError as err:
        return err
    return None


class Unanswered(set):
    """The tasks of requests without a response yet; ``stopping`` once the server cancels them,
    ``refusing`` while it refuses new requests (its shutdown has begun)."""

    stopping = False
    refusing = False


def _short_startup_failure(send: Send) -> Send:
    async def send_short(message: Message) -> None:
        if message["type"] == "lifespan.startup.failed" and message.get("message"):
            text = str(message["message"]).strip()
            log.debug("start-up failed:\n%s", text)
            message = {**message, "message": f"cannot start the gateway: {text.splitlines()[-1]}"}
        await send(message)

    return send_short


_WITH_BODY = frozenset(("POST", "PUT", "PATCH"))


def _encoded_body(value: bytes) -> ApiError | None:
    """415 for a compressed body (found by QA: a gzip body was read as JSON and refused as 400
    ``invalid_json``, which sent the client looking for a JSON mistake). ``identity`` passes."""
    codings = [c.strip().lower() for c in value.decode("latin-1").split(",") if c.strip()]
    if all(c == "identity" for c in codings):
        return None
    return ApiError(415, f"Content-Encoding {value.decode('latin-1').strip()!r} is not supported: send the body "
                    "uncompressed (no Content-Encoding, or identity).", code="unsupported_content_encoding",
                    headers={"accept-encoding": "identity"})


def _count_response(scope: Scope, status: int) -> None:
    """The response in ``GET /metrics``'s counters (``gateway.metrics``), when the app has them."""
    services = getattr(getattr(scope["app"].state, "pagegate", None), "services", None)
    metrics = getattr(services, "metrics", None)
    if metrics is not None:
        metrics.count_response(scope["path"], status)


def new_request_id() -> str:
    return "req_" + new_hex_id()


def too_large(max_bytes: int, size: int | None) -> str:
    said = f"{size:,} bytes" if size is not None else f"more than {max_bytes:,} bytes"
    return f"The request body is too large ({said}); the limit is {max_bytes:,} bytes."


def _host_name(host: str) -> str:
    """The name or address of a ``Host`` header's value, without its port (``[::1]:8000`` is ``::1``)."""
    host = host.strip()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _bodiless(send: Send) -> Send:
    """``send`` for a HEAD answered as a GET: the body's bytes left out, its framing kept."""
    async def send_head(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            message = {**message, "body": b""}
        await send(message)

    return send_head


class GatewayMiddleware:
    """``direct``: path → handler for POST requests the middleware serves itself; the handler
    raises ``ApiError`` (or a 413 ``HTTPException`` from reading the body) to refuse."""

    def __init__(self, app: ASGIApp, *, max_bytes: int = 1 << 62,
                 direct: dict[str, DirectRoute] | None = None, unanswered: Unanswered | None = None,
                 loopback_hosts_only: bool = False) -> None:
        self.app = app
        self.loopback_hosts_only = loopback_hosts_only
        self.max_bytes = max_bytes
        self.direct = dict(direct or {})
        self.unanswered = Unanswered() if unanswered is None else unanswered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, _short_startup_failure(send) if scope["type"] == "lifespan" else send)
            return
        request_id = new_request_id()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["started"] = time.perf_counter()
        extra: dict[str, str] = {}
        state["response_headers"] = extra
        state["engine_notice"] = None
        started = False
        task = asyncio.current_task()
        unanswered = self.unanswered
        unanswered.add(task)

        async def send_with_context(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                unanswered.discard(task)
                _count_response(scope, message["status"])
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                # (found by a security QA: JSON that echoes input was sent without it; pages had it)
                if not any(name.lower() == b"x-content-type-options" for name, _ in headers):
                    headers.append((b"x-content-type-options", b"nosniff"))
                # the admin API's answers (a new key in clear among them) are no one's to keep
                if scope["path"].startswith("/admin/v1") and not any(name.lower() == b"cache-control"
                                                                     for name, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                if extra:
                    present = {name.lower() for name, _ in headers}
                    for name, value in extra.items():
                        raw = name.lower().encode("latin-1")
                        if raw not in present:
                            headers.append((raw, str(value).encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            refusal = shutting_down(started=False) if unanswered.refusing else await self._admit(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, send_with_context)
                return
            receive = self._limited(receive)
            if scope["method"] == "HEAD" and scope["path"].startswith("/admin"):
                # the admin API's and dashboard's GETs answer HEAD too: the same status and headers
                # without the body (RFC 9110 9.3.2; found by QA: 405, where /v1/models and /health
                # answered). A copy: the server keeps its own scope, whose HEAD it honours too.
                scope = {**scope, "method": "GET"}
                await self.app(scope, receive, _bodiless(send_with_context))
                return
            handler = self.direct.get(scope["path"]) if scope["method"] == "POST" else None
            if handler is None:
                await self.app(scope, receive, send_with_context)
                return
            try:
                response = await handler(Request(scope, receive))
            except ApiError as err:
                response = error_response(err)
            except HTTPException as exc:  # the body outgrew the limit while it was read
                response = http_error_response(exc)
            await response(scope, receive, send_with_context)
        except asyncio.CancelledError:
            if started or not unanswered.stopping:
                raise
            task.uncancel()  # cancelled by the shutdown only to answer it: it ends here
            await error_response(shutting_down())(scope, receive, send_with_context)
        except Exception:
            log.exception("unhandled error in request %s", request_id)
            if started:
                return  # the response is under way; the server closes the connection
            body = json.dumps(INTERNAL_ERROR).encode()
            _count_response(scope, 500)
            await send({"type": "http.response.start", "status": 500, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", request_id.encode()),
            ]})
            await send({"type": "http.response.body", "body": body})
        finally:
            unanswered.discard(task)
            notice = state.get("engine_notice")
            if notice is not None:
                notice.close()  # a no-op once the engine took the request

    async def _admit(self, scope: Scope) -> ApiError | None:
        """The per-address limit, then a body whose ``content-length`` is over the limit, then, on
        the routes that take a body, the API key (``KEY_FIRST``). With ``loopback_hosts_only``, first
        a ``Host`` that names no loopback address is refused (found by a security QA: in dev mode,
        on the public admin secret, a page whose domain rebinds to 127.0.0.1 could mint admin
        tokens and call the admin API as the same origin)."""
        if self.loopback_hosts_only:
            host = next((value for name, value in scope.get("headers", ()) if name == b"host"), None)
            # (no Host at all: an HTTP/1.0 tool, never a browser, which rebinding needs)
            if host is not None and not is_loopback(_host_name(host.decode("latin-1"))):
                return ApiError(421, "This development server answers only requests addressed to localhost, "
                                     "127.0.0.1 or [::1]: a page of another site must not reach it through DNS "
                                     "rebinding. Set PAGEGATE_ADMIN_JWT_SECRET to serve under another name.",
                                code="misdirected_request")
        if scope["path"].startswith(LIMITED_PREFIXES):
            limiter = getattr(getattr(scope["app"].state, "pagegate", None), "ip_limiter", None)
            if limiter is not None:
                try:
                    await limiter.check_scope(scope)
                except ApiError as err:
                    # the admin API stays usable while Redis is down (it needs only the database)
                    if err.status != 503 or scope["path"].startswith("/v1/"):
                        return err
        authorization = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_bytes:
                    return ApiError(413, too_large(self.max_bytes, int(value)), code="request_too_large")
            elif name == b"content-encoding" and scope["method"] in _WITH_BODY:
                refusal = _encoded_body(value)
                if refusal is not None:
                    return refusal
            elif name == b"authorization":
                if authorization is not None:  # one credential a request (found by QA: the first won,
                    return ApiError(  # so a proxy adding its own could be overridden by the client's)
                        400, "This request has more than one Authorization header; send exactly one.",
                        code="duplicate_authorization_header")
                authorization = value
        if scope["method"] == "POST" and scope["path"] in KEY_FIRST:
            return await _key_first(scope, authorization)
        return None

    def _limited(self, receive: Receive) -> Receive:
        """``receive`` that refuses a body that keeps coming past the limit: a chunked one, and
        one whose ``content-length`` is not what frames it (h11 accepts a ``content-length`` next
        to ``transfer-encoding: chunked`` and reads the body as chunked)."""
        seen = 0
        max_bytes = self.max_bytes

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise HTTPException(413, too_large(max_bytes, None))
            return message

        return limited_receive
