"""Fixtures for the admin tests: a real SQLite file and a real PostgreSQL database per session
(schema by ``alembic upgrade head``), real Redis DB 6 under a unique key prefix, and an app
holding the admin router."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest
import redis as redis_sync
from admin_testlib import SECRET
from fastapi import FastAPI

import admin
from admin.auth import mint_token
from gateway.db.session import upgrade_sync
from gateway.settings import Settings

PG_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/6"


def _pg(sql: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def db_url(request, tmp_path_factory) -> str:
    """A migrated database, one per backend for the whole session."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('admin-db') / 'admin.db'}"
        upgrade_sync(url)
        yield url
        return
    name = f"pg_admin_{uuid.uuid4().hex[:12]}"
    _pg(f'CREATE DATABASE "{name}"')
    url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    try:
        upgrade_sync(url)
        yield url
    finally:
        _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def redis_prefix() -> str:
    """One Redis key prefix per session (Redis DB 6), deleted at the end."""
    prefix = f"pgtest-admin-{uuid.uuid4().hex[:8]}:"
    yield prefix
    client = redis_sync.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="session")
def settings(db_url: str, redis_prefix: str) -> Settings:
    return Settings(database_url=db_url, redis_url=REDIS_URL, redis_prefix=redis_prefix,
                    admin_jwt_secret=SECRET, load_engine=False, dev_mode=False)


@pytest.fixture(scope="session")
def _shared_app(settings: Settings) -> FastAPI:
    """Routers are built once per backend (building ~35 routes costs ~0.5 s)."""
    app = FastAPI()
    router = admin.build_admin_router(settings)
    app.include_router(router)
    app.state.admin_context = router.admin_context
    return app


@pytest.fixture
async def app(_shared_app: FastAPI) -> AsyncIterator[FastAPI]:
    yield _shared_app
    # engines and Redis clients belong to this test's event loop: close them; reopened lazily
    await _shared_app.state.admin_context.aclose()


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin.test") as c:
        yield c


@pytest.fixture
def token(settings: Settings):
    def make(*scopes: str, sub: str = "alice", ttl_s: int = 600) -> str:
        return mint_token(settings, subject=sub, scopes=scopes or ("admin:read", "admin:write"), ttl_s=ttl_s)

    return make


@pytest.fixture
def auth(token):
    def make(*scopes: str, sub: str = "alice") -> dict[str, str]:
        return {"authorization": f"Bearer {token(*scopes, sub=sub)}"}

    return make


@pytest.fixture
def env(settings, monkeypatch):  # noqa: ANN001, ANN201
    """The admin CLI's environment: the test settings' database, Redis and admin secret."""
    monkeypatch.setenv("PAGEGATE_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("PAGEGATE_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("PAGEGATE_REDIS_PREFIX", settings.redis_prefix)
    monkeypatch.setenv("PAGEGATE_ADMIN_JWT_SECRET", SECRET)
    return settings
