"""The error plumbing on its own (no engine): the catch-all 500, ApiError headers, the SSE
writer's error event and its guarantee to close the producer, and field names in ``param``."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI

from gateway.error_handlers import install_error_handlers, param_from_loc
from gateway.errors import ApiError, rate_limited
from gateway.middleware import GatewayMiddleware
from gateway.sse import SSEResponse, encode_stream


def _app(closed: list) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(GatewayMiddleware)

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("secret internal detail")

    @app.get("/limited")
    async def limited() -> dict:
        raise rate_limited("slow down", retry_after_s=2.5, headers={"x-ratelimit-remaining-requests": "0"})

    @app.get("/stream-fails")
    async def stream_fails() -> SSEResponse:
        async def events():  # noqa: ANN202
            try:
                yield {"n": 1}
                raise ApiError(503, "engine went away", "server_error", "engine_unavailable")
            finally:
                closed.append("producer")

        return SSEResponse(events())

    return app


async def _get(app: FastAPI, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get(path)


def test_unhandled_exception_is_an_openai_500_without_traceback() -> None:
    resp = asyncio.run(_get(_app([]), "/boom"))
    assert resp.status_code == 500
    assert resp.headers["x-request-id"].startswith("req_")
    body = resp.json()
    assert body["error"]["type"] == "server_error" and body["error"]["code"] == "internal_error"
    assert "secret" not in resp.text and "Traceback" not in resp.text


def test_api_error_headers_and_retry_after() -> None:
    resp = asyncio.run(_get(_app([]), "/limited"))
    assert resp.status_code == 429
    assert resp.headers["retry-after"] == "3" and resp.headers["retry-after-ms"] == "2500"
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    assert resp.json()["error"] == {"message": "slow down", "type": "rate_limit_exceeded", "param": None,
                                    "code": "rate_limit_exceeded"}


def test_stream_error_becomes_an_error_event_and_the_producer_is_closed() -> None:
    closed: list = []
    resp = asyncio.run(_get(_app(closed), "/stream-fails"))
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    assert resp.text == ('data: {"n":1}\n\n'
                         'data: {"error":{"message":"engine went away","type":"server_error","param":null,'
                         '"code":"engine_unavailable"}}\n\n')
    assert closed == ["producer"]


def test_abandoned_stream_closes_its_producer() -> None:
    closed: list = []

    async def events():  # noqa: ANN202
        try:
            for i in range(100):
                yield {"i": i}
        finally:
            closed.append("producer")

    async def main() -> list[bytes]:
        frames = encode_stream(events())
        got = [await anext(frames), await anext(frames)]
        await frames.aclose()  # what the server does when the client goes away
        return got

    assert asyncio.run(main()) == [b'data: {"i":0}\n\n', b'data: {"i":1}\n\n']
    assert closed == ["producer"]


def test_param_names() -> None:
    assert param_from_loc(("body", "messages", 0, "content", "str")) == "messages[0].content"
    assert param_from_loc(("body", "messages", 2, "content", "list[TextPart]", 0, "type")) == "messages[2].content[0].type"
    assert param_from_loc(("body", "stream_options", "include_usage")) == "stream_options.include_usage"
    assert param_from_loc(("body", "model")) == "model"
    assert param_from_loc(("body",)) is None


def test_until_done_or_disconnect() -> None:
    """The work runs in the caller's task; a disconnect cancels it and leaves the caller uncancelled."""
    from gateway.chat_service import until_done_or_disconnect

    async def scenario() -> list:
        out: list = []
        gone = asyncio.Event()

        async def receive() -> dict:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def work(seconds: float) -> None:
            try:
                await asyncio.sleep(seconds)
                out.append("done")
            except asyncio.CancelledError:
                out.append("cancelled")
                raise

        out.append(await until_done_or_disconnect(work(0), receive))  # finished first
        gone.set()  # a disconnect after the work ended must not cancel the caller later
        await asyncio.sleep(0.01)
        gone.clear()
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, gone.set)
        out.append(await until_done_or_disconnect(work(10), receive))  # the client leaves first
        out.append(asyncio.current_task().cancelling())
        await asyncio.sleep(0)  # the caller goes on (settles) unhindered

        async def fails() -> None:
            raise ApiError(503, "engine went away", "server_error", "engine_unavailable")

        gone.clear()
        try:
            await until_done_or_disconnect(fails(), receive)
        except ApiError as err:
            out.append(err.code)
        return out

    assert asyncio.run(scenario()) == ["done", True, "cancelled", False, 0, "engine_unavailable"]


def test_a_cancellation_from_outside_is_not_swallowed_by_a_disconnect() -> None:
    from gateway.chat_service import until_done_or_disconnect

    async def scenario() -> str:
        gone = asyncio.Event()

        async def receive() -> dict:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def request() -> None:
            await until_done_or_disconnect(asyncio.sleep(10), receive)

        task = asyncio.ensure_future(request())
        await asyncio.sleep(0.01)
        gone.set()  # the client leaves and, before the request runs again, the server cancels it
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "swallowed"

    assert asyncio.run(scenario()) == "cancelled"
