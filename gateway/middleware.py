"""Request context as a pure ASGI middleware (no BaseHTTPMiddleware: it would buffer streams).

- gives every request an id (``request.state.request_id``) and every response ``x-request-id``;
- adds ``request.state.response_headers`` (rate-limit, quota, cache headers set while the request
  is handled) to whatever response goes out, streams included;
- the catch-all: an exception nothing else handled becomes a 500 OpenAI error without traceback
  (logged with the request id). Bad input never gets here: it is a 400 from the handlers.
"""

from __future__ import annotations

import json
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
