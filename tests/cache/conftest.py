"""Cache test fixtures: one embedding model per session, real Redis (DB 4) with a unique key
prefix per test, removed afterwards."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from cache.api import CachePolicy
from cache.embedder import Embedder
from cache.semantic_cache import SemanticCache

REDIS_URL = "redis://127.0.0.1:6379/4"


@pytest.fixture(scope="session")
def embedder():
    e = Embedder()
    e._load()
    yield e
    e.close()


@pytest.fixture
def prefix():
    return f"test-cache-{uuid.uuid4().hex[:10]}:"


@pytest.fixture
async def redis_client(prefix):
    r = aioredis.Redis.from_url(REDIS_URL)
    yield r
    async for k in r.scan_iter(match=prefix + "*", count=1000):
        await r.delete(k)
    await r.aclose()


@pytest.fixture
async def make_cache(embedder, prefix, redis_client):
    """Build caches sharing the model but each with its own Redis client and in-process index
    (as two gateway processes would)."""
    made: list[tuple[SemanticCache, aioredis.Redis]] = []

    def make(**kw) -> SemanticCache:
        r = aioredis.Redis.from_url(kw.pop("url", REDIS_URL), **kw.pop("client_kw", {}))
        c = SemanticCache(r, kw.pop("embedder", embedder), prefix=kw.pop("prefix", prefix), **kw)
        made.append((c, r))
        return c

    yield make
    for c, r in made:
        await c.close()
        await r.aclose()


@pytest.fixture
def policy():
    return CachePolicy(threshold=0.80)
