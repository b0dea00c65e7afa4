"""A graceful shutdown that runs out (``gateway.shutdown.DrainingServer``): requests still running
just before uvicorn's graceful timeout end as a 503 ``server_shutting_down`` (a stream: its error
event) with their usage rows, instead of cut connections, and uvicorn has nothing left to cancel."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

import openai
import pytest

pytestmark = pytest.mark.timeout(180)


async def _serve_draining(app, port: int, grace: float):  # noqa: ANN001, ANN202
    import uvicorn

    from gateway.shutdown import DrainingServer

    server = DrainingServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                           timeout_graceful_shutdown=grace))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    return server, task


async def _tenant_key(db) -> str:  # noqa: ANN001
    from gateway import tenancy as svc

    async with db.sessionmaker() as session:
        tenant = await svc.create_tenant(session, name="drain")
        _row, new = await svc.create_api_key(session, tenant_id=tenant.id)
        await session.commit()
    return new.key


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_requests_running_at_the_graceful_timeout_end_with_a_503(api, api_loop, api_engine, tmp_path,
                                                                   caplog) -> None:  # noqa: ANN001
    from gateway.app import create_app
    from gateway.db.session import upgrade_sync
    from gateway.settings import Settings

    url = f"sqlite+aiosqlite:///{tmp_path / 'pagegate.db'}"
    upgrade_sync(url)
    settings = Settings(database_url=url, redis_url=api.settings.redis_url, redis_prefix=api.settings.redis_prefix
                        + "drain:", data_dir=str(tmp_path / "data"), usage_spool_dir=str(tmp_path / "spool"),
                        cache_enabled=False, load_engine=False, default_rpm=0, default_tpm=0)
    app = create_app(settings, engine=api_engine)
    port = _free_port()
    server, task = api_loop.run(_serve_draining(app, port, grace=3.0))  # the cut comes 1.5 s in
    services = app.state.pagegate.services
    key = api_loop.run(_tenant_key(services.db))
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=60)
    long = dict(model=api_engine.model_id, messages=[{"role": "user", "content": "Count to a thousand."}],
                max_tokens=1500, temperature=0, extra_body={"ignore_eos": True})
    caplog.set_level(logging.WARNING)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        stream = client.chat.completions.create(stream=True, **long)
        chunks = iter(stream)
        assert next(chunks).choices[0].delta.role == "assistant"
        whole = pool.submit(client.chat.completions.with_raw_response.create, **long)
        # not in the engine: a batch of embeddings that takes far longer than the grace
        embeddings = pool.submit(client.embeddings.create, model="all-MiniLM-L6-v2", input=["word " * 150] * 2000)
        time.sleep(0.5)  # the JSON request and the embeddings are running too
        asyncio.run_coroutine_threadsafe(_exit(server), api_loop.loop).result(5)
        started = time.monotonic()
        texts = []
        with pytest.raises(openai.APIError) as cut:  # the stream's error event
            for chunk in chunks:
                texts.append(chunk.choices[0].delta.content or "")
        assert cut.value.code == "server_shutting_down" and "shutting down" in cut.value.message
        assert len(texts) > 3  # it kept streaming until the cut
        with pytest.raises(openai.InternalServerError) as refused:
            whole.result(30)
        assert refused.value.status_code == 503 and refused.value.code == "server_shutting_down"
        assert refused.value.response.headers["retry-after"] == "1"  # as the other 503s (found by QA)
        with pytest.raises(openai.InternalServerError) as answered:  # by the middleware: JSON, not a bare 500
            embeddings.result(30)
        assert answered.value.status_code == 503 and answered.value.code == "server_shutting_down"
        assert answered.value.response.headers["x-request-id"].startswith("req_")
    api_loop.run(asyncio.wait_for(asyncio.shield(task), 30))
    assert time.monotonic() - started < 3.0  # done before uvicorn's timeout: nothing to cancel
    assert not [r for r in caplog.records if "graceful shutdown exceeded" in r.getMessage()]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback
    assert any("with a 503 server_shutting_down" in r.getMessage() for r in caplog.records)
    rows = asyncio.run(_rows(url))  # the lifespan closed the writer: the rows reached the database
    # the stream is billed what it delivered; the JSON answer delivered nothing and costs nothing
    # (the SDKs retry a 503: it would be paid twice); the embeddings (a row once reserved) nothing
    chat = sorted((r.status, r.completion_tokens > 0) for r in rows if r.endpoint != "embeddings")
    assert chat == [("error", False), ("error", True)], rows
    assert all(r.status == "error" and r.prompt_tokens == 0 for r in rows if r.endpoint == "embeddings"), rows


async def _exit(server) -> None:  # noqa: ANN001
    server.should_exit = True


async def _rows(url: str) -> list:
    from sqlalchemy import select
    from sqlalchemy.ext.asyncio import create_async_engine

    from gateway.db.models import UsageRecord

    db = create_async_engine(url)
    try:
        async with db.connect() as conn:
            return list((await conn.execute(select(UsageRecord.status, UsageRecord.endpoint, UsageRecord.prompt_tokens,
                                                   UsageRecord.completion_tokens))).all())
    finally:
        await db.dispose()


def test_requests_arriving_as_the_shutdown_begins_get_a_503_not_a_reset(api, api_loop, api_engine, tmp_path,
                                                                         monkeypatch) -> None:  # noqa: ANN001
    """Closing the listening sockets resets the connections in their accept queue; for a moment
    before that, new requests are accepted and refused with a 503 (the SDKs retry it)."""
    from gateway import shutdown
    from gateway.app import create_app
    from gateway.settings import Settings

    monkeypatch.setattr(shutdown, "REFUSE_NEW_S", 2.0)  # (0.25 s in service: this test needs a window)
    settings = Settings(database_url=api.settings.database_url, redis_url=api.settings.redis_url,
                        redis_prefix=api.settings.redis_prefix, data_dir=str(tmp_path / "data"),
                        usage_spool_dir=str(tmp_path / "spool"), cache_enabled=False, load_engine=False)
    app = create_app(settings, engine=api_engine)
    port = _free_port()
    server, task = api_loop.run(_serve_draining(app, port, grace=3.0))
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=api.key, max_retries=0, timeout=10)
    assert client.models.list().data  # served
    asyncio.run_coroutine_threadsafe(_exit(server), api_loop.loop).result(5)
    deadline = time.monotonic() + 5
    while not app.state.unanswered.refusing:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(openai.InternalServerError) as refused:
        client.models.list()
    assert refused.value.status_code == 503 and refused.value.code == "server_shutting_down"
    assert "did not start this request" in refused.value.message  # (not "stopped it before it finished")
    api_loop.run(asyncio.wait_for(asyncio.shield(task), 30))
    with pytest.raises(openai.APIConnectionError):  # closed now: refused by the kernel, as before
        client.models.list()
