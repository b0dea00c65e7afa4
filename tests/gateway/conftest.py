"""Fixtures for tests/gateway (shared by the API and the tenancy tests)."""

from __future__ import annotations

# --- tenancy fixtures: real Redis (DB 2, one key prefix per test), real PostgreSQL (one migrated
# --- database per session, emptied before each test) and SQLite files ---------------------------
import asyncio
import os
import uuid

import pytest

TENANCY_REDIS_URL = os.environ.get("PAGEGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")
PG_ADMIN_DSN = os.environ.get("PAGEGATE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_url(dbname: str) -> str:
    base = PG_ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://", 1)
    return f"{base}/{dbname}"


async def _pg_admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def pg_admin(sql: str) -> None:
    """Run one statement on the `test` database (CREATE/DROP DATABASE), from sync code."""
    asyncio.run(_pg_admin(sql))


class PgTools:
    """For tests that manage PostgreSQL databases themselves: ``url(name)``, ``await execute(sql)``."""

    url = staticmethod(_pg_url)
    execute = staticmethod(_pg_admin)


@pytest.fixture
def pg_tools() -> PgTools:
    return PgTools()


@pytest.fixture(scope="session")
def pg_template() -> str:
    """A migrated PostgreSQL database used as TEMPLATE for per-test databases."""
    from gateway.db.session import upgrade_sync

    name = f"pgt_tmpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    pg_admin(f'CREATE DATABASE "{name}"')
    try:
        upgrade_sync(_pg_url(name))
        yield name
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_session_db(pg_template: str) -> str:
    """One migrated PostgreSQL database for the session's tenancy tests (dropped at the end)."""
    name = f"pgt_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    pg_admin(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield name
    pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _pg_truncate(dbname: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN_DSN.rsplit("/", 1)[0] + "/" + dbname)
    try:
        await conn.execute("TRUNCATE usage_records, api_keys, tenants, model_prices, audit_log "
                           "RESTART IDENTITY CASCADE")
    finally:
        await conn.close()


@pytest.fixture
def pg_url(pg_session_db: str) -> str:
    """A migrated PostgreSQL database emptied for this test (cheaper than one database per test)."""
    asyncio.run(_pg_truncate(pg_session_db))
    return _pg_url(pg_session_db)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A migrated SQLite file for this test."""
    from gateway.db.session import upgrade_sync

    url = f"sqlite+aiosqlite:///{tmp_path / 'pagegate.db'}"
    upgrade_sync(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Both backends: a migrated database URL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def _delete_prefixed_keys(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (a test's own namespace) on the Redis at ``url``."""

    async def cleanup() -> None:
        from redis.asyncio import Redis

        r = Redis.from_url(url)
        try:
            keys = [k async for k in r.scan_iter(match=prefix + "*", count=1000)]
            if keys:
                await r.delete(*keys)
        finally:
            await r.aclose()

    asyncio.run(cleanup())


@pytest.fixture
def redis_prefix() -> str:
    """A unique key prefix on TENANCY_REDIS_URL; its keys are deleted after the test."""
    prefix = f"pgt:{uuid.uuid4().hex[:10]}:"
    yield prefix
    _delete_prefixed_keys(TENANCY_REDIS_URL, prefix)


@pytest.fixture
def tenancy_settings(tmp_path, db_url, redis_prefix):
    """Settings pointing at this test's database, Redis prefix and spool directory."""
    from gateway.settings import Settings

    return Settings(database_url=db_url, redis_url=TENANCY_REDIS_URL, redis_prefix=redis_prefix,
                    data_dir=str(tmp_path / "data"), usage_spool_dir=str(tmp_path / "spool"),
                    usage_flush_interval_s=0.05, load_engine=False)


@pytest.fixture
async def tenancy(tenancy_settings):
    """Started TenancyServices for this test's settings; closed afterwards."""
    from gateway.tenancy_services import build_tenancy

    services = await build_tenancy(tenancy_settings, redis_url=TENANCY_REDIS_URL)
    yield services
    await services.close()


@pytest.fixture
def make_tenant(tenancy):
    """``await make_tenant(name=None, **create_tenant_kwargs)`` → (Tenant, key string, ApiKey)."""
    from gateway import tenancy as svc

    async def make(name: str | None = None, *, allowed_models=None, key_rpm=None, **kwargs):
        async with tenancy.db.sessionmaker() as session:
            tenant = await svc.create_tenant(session, name=name or f"t-{uuid.uuid4().hex[:8]}", **kwargs)
            row, new = await svc.create_api_key(session, tenant_id=tenant.id, allowed_models=allowed_models,
                                                rpm=key_rpm)
            await session.commit()
        return tenant, new.key, row

    return make
# --- end of tenancy fixtures -------------------------------------------------------------------


# --- API fixtures: one event-loop thread per session hosts the real engine (SmolLM2, loaded once)
# --- and real uvicorn servers on free 127.0.0.1 ports (SQLite and PostgreSQL), real Redis DB 1 ---
import socket  # noqa: E402
import threading  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

API_REDIS_URL = os.environ.get("PAGEGATE_TEST_API_REDIS_URL", "redis://127.0.0.1:6379/1")


class LoopThread:
    """An asyncio loop on a daemon thread; ``run(coro)`` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="api-test-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 300):  # noqa: ANN001, ANN201
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ApiServer:
    """A running gateway: its URL, settings, app and a tenant with one key (``key``)."""

    base_url: str
    settings: Any
    app: Any
    loop: LoopThread
    key: str
    tenant_id: int
    model: str
    server: Any = None
    task: Any = None

    @property
    def services(self):  # noqa: ANN201
        return self.app.state.pagegate.services

    def openai(self, key: str | None = None, **kwargs):  # noqa: ANN201
        import openai

        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=key or self.key, max_retries=0,
                             timeout=120, **kwargs)

    def async_openai(self, key: str | None = None, **kwargs):  # noqa: ANN201
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url + "/v1", api_key=key or self.key, max_retries=0,
                                  timeout=120, **kwargs)

    def make_tenant(self, *, allowed_models: list[str] | None = None, **kwargs) -> tuple[int, str]:
        """A new tenant (``create_tenant`` kwargs: rpm, tpm, budget_tokens, ...) and one key for it."""
        return self.loop.run(_make_tenant(self.services.db, allowed_models=allowed_models, **kwargs))

    def settle_pending(self) -> None:
        """Run the quota settlements of requests that just ended (deferred by ``settle_delay_ms``)."""
        self.loop.run(self.services.aftercare.drain())

    def usage_rows(self, request_id: str | None = None) -> list[Any]:
        """Usage rows (after flushing the writer), optionally of one request id."""
        return self.loop.run(_usage_rows(self.services, request_id))


async def _make_tenant(db, *, allowed_models=None, **kwargs) -> tuple[int, str]:  # noqa: ANN001
    from gateway import tenancy as svc

    async with db.sessionmaker() as session:
        tenant = await svc.create_tenant(session, name=f"api-{uuid.uuid4().hex[:8]}", **kwargs)
        _row, new = await svc.create_api_key(session, tenant_id=tenant.id, allowed_models=allowed_models)
        await session.commit()
    return tenant.id, new.key


async def _usage_rows(services, request_id):  # noqa: ANN001, ANN202
    from sqlalchemy import select

    from gateway.db.models import UsageRecord

    await services.usage.flush()
    stmt = select(UsageRecord).order_by(UsageRecord.id)
    if request_id is not None:
        stmt = stmt.where(UsageRecord.request_id == request_id)
    async with services.db.sessionmaker() as session:
        return list((await session.execute(stmt)).scalars())


async def _start_engine():  # noqa: ANN202
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    config = EngineConfig(model="smollm2-135m-instruct", device="cpu", dtype="float32", num_blocks=512,
                          max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=512)
    engine = AsyncEngine(config)
    await engine.start()
    return engine


async def _serve(app, port: int):  # noqa: ANN001, ANN202
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", timeout_graceful_shutdown=5))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn stopped during start-up")
        await asyncio.sleep(0.02)
    return server, task


async def _stop(server, task) -> None:  # noqa: ANN001
    server.should_exit = True
    await asyncio.wait_for(task, 30)


@pytest.fixture(scope="session")
def api_loop():
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def api_engine(api_loop):
    """The real in-process engine with SmolLM2-135M-Instruct, started once per session."""
    engine = api_loop.run(_start_engine())
    yield engine
    api_loop.run(engine.shutdown())


@pytest.fixture(scope="session")
def api_redis_prefix():
    prefix = f"pgapi:{uuid.uuid4().hex[:10]}:"
    yield prefix
    _delete_prefixed_keys(API_REDIS_URL, prefix)


def _launch(loop: LoopThread, engine, database_url: str, tmp, prefix: str, **overrides) -> ApiServer:  # noqa: ANN001
    from gateway.app import create_app
    from gateway.db.session import upgrade_sync
    from gateway.settings import Settings

    upgrade_sync(database_url)
    values = dict(database_url=database_url, redis_url=API_REDIS_URL, redis_prefix=prefix,
                  data_dir=str(tmp / "data"), usage_spool_dir=str(tmp / "spool"), usage_flush_interval_s=0.05,
                  default_rpm=100_000, default_tpm=10_000_000, cache_enabled=False, load_engine=False)
    values.update(overrides)
    settings = Settings(**values)
    app = create_app(settings, engine=engine)
    port = free_port()
    server, task = loop.run(_serve(app, port))
    api = ApiServer(base_url=f"http://127.0.0.1:{port}", settings=settings, app=app, loop=loop, key="",
                    tenant_id=0, model=engine.model_id, server=server, task=task)
    api.tenant_id, api.key = api.make_tenant()
    return api


@pytest.fixture(scope="session")
def api_sqlite(api_loop, api_engine, api_redis_prefix, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api-sqlite")
    api = _launch(api_loop, api_engine, f"sqlite+aiosqlite:///{tmp / 'pagegate.db'}", tmp,
                  api_redis_prefix + "sqlite:")
    yield api
    api_loop.run(_stop(api.server, api.task))


@pytest.fixture(scope="session")
def api_postgres(api_loop, api_engine, api_redis_prefix, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api-pg")
    name = f"pgapi_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    pg_admin(f'CREATE DATABASE "{name}"')
    try:
        api = _launch(api_loop, api_engine, _pg_url(name), tmp, api_redis_prefix + "pg:")
        yield api
        api_loop.run(_stop(api.server, api.task))
    finally:
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def api_cached(api_loop, api_engine, api_redis_prefix, tmp_path_factory):
    """A gateway (SQLite) with the semantic cache switched on."""
    tmp = tmp_path_factory.mktemp("api-cache")
    api = _launch(api_loop, api_engine, f"sqlite+aiosqlite:///{tmp / 'pagegate.db'}", tmp,
                  api_redis_prefix + "cache:", cache_enabled=True)
    yield api
    api_loop.run(_stop(api.server, api.task))


@pytest.fixture(params=["sqlite", "postgresql"])
def api_any(request) -> ApiServer:
    """The gateway on each database backend (for the core end-to-end subset)."""
    return request.getfixturevalue("api_sqlite" if request.param == "sqlite" else "api_postgres")


@pytest.fixture
def api(api_sqlite) -> ApiServer:
    """The gateway on SQLite (most API tests)."""
    return api_sqlite
# --- end of API fixtures -----------------------------------------------------------------------


@pytest.fixture
def unfrozen():
    """No object frozen and no other app's ``gateway.heap.Refreezer`` installed (the session's API
    servers have theirs) while the test runs; both restored afterwards."""
    import gc

    from gateway.heap import Refreezer

    others = [cb for cb in gc.callbacks if isinstance(cb, Refreezer)]
    for cb in others:
        gc.callbacks.remove(cb)
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.callbacks.extend(others)
