"""The Redis Query Engine path (FT.CREATE HNSW / FT.SEARCH KNN). Runs where a server with the
Query Engine is reachable: PAGEGATE_TEST_REDIS_STACK_URL (e.g. redis-stack or Redis 8:
``docker run -p 6380:6379 redis/redis-stack-server`` then
``PAGEGATE_TEST_REDIS_STACK_URL=redis://127.0.0.1:6380/0 pytest tests/cache``), or the shared
Redis if it has the module. Skipped otherwise: the Redis 7.0 here has no FT.* commands."""

import os

import pytest
import redis.asyncio as aioredis
from cache_testlib import answer, chat

from cache.ft_index import has_query_engine

URL = os.environ.get("PAGEGATE_TEST_REDIS_STACK_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
async def stack_url(prefix):
    r = aioredis.Redis.from_url(URL)
    try:
        ok = await has_query_engine(r)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no Redis at {URL}: {e}")
    if not ok:
        await r.aclose()
        pytest.skip(f"Redis at {URL} has no Query Engine (FT._LIST unknown); set PAGEGATE_TEST_REDIS_STACK_URL")
    yield URL
    try:
        await r.execute_command("FT.DROPINDEX", f"{prefix}cache-idx")
    except Exception:  # noqa: BLE001
        pass
    async for k in r.scan_iter(match=prefix + "*", count=1000):
        await r.delete(k)
    await r.aclose()


async def test_query_engine_tiers_and_isolation(stack_url, make_cache, policy):
    c = make_cache(url=stack_url, index="ft")
    other = make_cache(url=stack_url, index="auto")
    body = chat("How do I reset my password?")
    await c.store("tenant-a", body, answer("reset link"), policy)
    assert c.index_kind == "ft"
    assert (await c.lookup("tenant-a", body, policy)).outcome == "hit"
    r = await other.lookup("tenant-a", chat("How can I reset my password?"), policy)
    assert other.index_kind == "ft"
    assert r.outcome == "semantic-hit" and r.response["choices"][0]["message"]["content"] == "reset link"
    assert (await other.lookup("tenant-b", body, policy)).outcome == "miss"
    assert (await other.lookup("tenant-b", chat("How can I reset my password?"), policy)).outcome == "miss"
    r = await c.lookup("tenant-a", chat("How do I reset my password?", max_tokens=3), policy)
    assert r.outcome == "miss"
