"""Request context as a pure ASGI middleware (no BaseHTTPMiddleware: it would buffer streams).

- gives every request an id (``request.state.request_id``) and every response ``x-request-id``;
- adds ``request.state.response_headers`` (rate-limit, quota, cache headers set while the request
  is handled) to whatever response goes out, streams included;
- ``BodyLimitMiddleware`` (inside it) refuses bodies over ``PAGEGATE_MAX_REQUEST_BYTES`` with 413;
- withdraws the request's engine notice (``request.state.engine_notice``, taken once its key is
  known: ``gateway.deps``) when the request ends without reaching the engine (refused, failed);
- the catch-all: an exception nothing else handled becomes a 500 OpenAI error without traceback
  (logged with the request id). Bad input never gets here: it is a 400 from the handlers.
"""

from __future__ import annotations

import json
import logging
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.error_handlers import error_response
from gateway.errors import ApiError
from gateway.ids import new_hex_id

log = logging.getLogger("pagegate.gateway")

INTERNAL_ERROR = {
    "error": {
        "message": "The server had an error while processing your request.",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
}


def new_request_id() -> str:
    return "req_" + new_hex_id()


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["started"] = time.perf_counter()
        extra: dict[str, str] = {}
        state["response_headers"] = extra
        state["engine_notice"] = None
        started = False

        async def send_with_context(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.append((b"x-request-id", request_id.encode()))
                for name, value in extra.items():
                    raw = name.lower().encode("latin-1")
                    if raw not in present:
                        headers.append((raw, str(value).encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_context)
        except Exception:
            log.exception("unhandled error in request %s", request_id)
            if started:
                return  # the response is under way; the server closes the connection
            body = json.dumps(INTERNAL_ERROR).encode()
            await send({"type": "http.response.start", "status": 500, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", request_id.encode()),
            ]})
            await send({"type": "http.response.body", "body": body})
        finally:
            notice = state.get("engine_notice")
            if notice is not None:
                notice.close()  # a no-op once the engine took the request


class BodyLimitMiddleware:
    """Pure ASGI: a request body over ``max_bytes`` is refused with 413 ``request_too_large``:
    at once when its ``content-length`` says so, else as soon as that much has arrived. Without a
    limit a 100 MB body was parsed whole (the process grew by 5 GB) before any check ran."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: int | None) -> HTTPException:
        said = f"{size:,} bytes" if size is not None else f"more than {self.max_bytes:,} bytes"
        return HTTPException(413, f"The request body is too large ({said}); the limit is {self.max_bytes:,} bytes.")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_bytes:
                    err = self._too_large(int(value))
                    await error_response(ApiError(413, err.detail, code="request_too_large"))(scope, receive, send)
                    return
                break
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # a chunked body (no length given) that keeps coming
                    raise self._too_large(None)
            return message

        await self.app(scope, limited_receive, send)
