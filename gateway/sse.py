"""The one Server-Sent-Events writer every stream goes through (chat, completions, cache replays).

    producer (async iterator of chunk objects)          SSEResponse
      chunk, chunk, ..., chunk  ──►  data: {json}\\n\\n  ...  data: [DONE]\\n\\n
      raises ApiError            ──►  data: {"error": {...}}\\n\\n          (stream ends, no [DONE])

The producer is always closed when the response ends, however it ends (finished, client gone,
server shutting down): its ``finally`` is where the engine request is aborted and the quota
settled, so it runs shielded from the cancellation that a client disconnect delivers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import ApiError

log = logging.getLogger("pagegate.sse")

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def encode_event(event: BaseModel | Mapping[str, Any] | bytes) -> bytes:
    """One ``data:`` line. Pydantic models keep their ``null`` fields, as OpenAI's chunks do.
    Bytes are an event this made already (a big one, encoded on a worker thread). U+2028 and
    U+2029 are written as JSON escapes: a client that splits its lines with Python's
    ``str.splitlines`` (httpx's ``iter_lines``) cut an event at them (found by QA)."""
    if isinstance(event, bytes):
        return event
    if isinstance(event, BaseModel):
        payload = event.model_dump_json().encode()
    else:
        try:
            payload = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()
        except UnicodeEncodeError:  # a lone surrogate quoted in an error: JSON's escape for it
            payload = json.dumps(event, separators=(",", ":")).encode()
    if b"\xe2\x80\xa8" in payload or b"\xe2\x80\xa9" in payload:  # (only ever inside JSON strings)
        payload = payload.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
    return b"data: " + payload + b"\n\n"


async def encode_stream(events: AsyncIterator[BaseModel | Mapping[str, Any]]) -> AsyncIterator[bytes]:
    """Frame ``events`` as SSE, end with ``[DONE]``; an error mid-stream becomes an error event."""
    try:
        async for event in events:
            yield encode_event(event)
    except ApiError as err:
        yield encode_event(err.body())
        return
    except Exception:  # never a traceback to the client; the stream just reports a server error
        log.exception("stream failed")
        yield encode_event(ApiError(500, "The server had an error while streaming the response.",
                                    "server_error", "internal_error").body())
        return
    finally:
        await _close(events)
    yield DONE


async def _close(events: AsyncIterator) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


class SSEResponse(StreamingResponse):
    """``text/event-stream`` response over a producer of chunk objects."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[BaseModel | Mapping[str, Any]], *,
                 headers: Mapping[str, str] | None = None) -> None:
        self._events = events
        super().__init__(encode_stream(events), headers={**SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # A disconnect cancels the writer at a send(); the producer may still be suspended.
            await _close(self.body_iterator)  # type: ignore[arg-type]
            await _close(self._events)
