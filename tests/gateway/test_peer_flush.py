"""The other gateway processes on the same Redis settle their ended requests and write their usage
rows when one process needs them (``gateway.peer_flush``): two ``TenancyServices`` in one test
process are two processes to each other (each has its own id, aftercare and journal)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.errors import ApiError
from gateway.tenancy_services import build_tenancy
from gateway.usage import UsageEvent

TENANCY_REDIS_URL = "redis://127.0.0.1:6379/2"  # (the conftest's; tests here must not import it)


async def _other(settings, tmp_path, **changes):  # noqa: ANN001, ANN202
    """A second gateway process on the same database and Redis (its own journal)."""
    return await build_tenancy(settings.model_copy(update={"usage_spool_dir": str(tmp_path / "spool-b"), **changes}),
                               redis_url=TENANCY_REDIS_URL)


async def test_a_refusal_asks_the_other_processes_to_settle_their_ended_requests(tenancy, tenancy_settings,
                                                                                make_tenant, tmp_path):
    """Found by QA with ``--workers 2``: a client whose previous request ended on the other worker
    was refused, "your requests in flight hold the rest of your budget", on every other request."""
    other = await _other(tenancy_settings, tmp_path)
    try:
        _, key, _ = await make_tenant(budget_tokens=100, tpm=0)
        p = await tenancy.auth.authenticate(f"Bearer {key}")
        other.aftercare.delay_s = 30.0  # (its settlement would not run by itself during this test)
        ended = await other.quota.reserve(p, model="m", prompt_tokens=10, max_tokens=90)  # the whole budget
        other.aftercare.submit(lambda: other.quota.settle_soon(ended, prompt_tokens=10, completion_tokens=20),
                               "(test)")
        nxt = await tenancy.quota.reserve(p, model="m", prompt_tokens=10, max_tokens=90)
        assert nxt.max_tokens == 60 and other.aftercare.pending == 0  # 100 - 30 spent - its prompt
        with pytest.raises(ApiError) as held:  # in flight for real: the others had nothing to settle
            await tenancy.quota.reserve(p, model="m", prompt_tokens=10, max_tokens=90)
        assert held.value.code == "rate_limit_exceeded" and "30 used and 70 reserved" in held.value.message
    finally:
        await other.close()


async def test_a_rebuilt_counter_counts_the_rows_still_in_other_processes_journals(tenancy, tenancy_settings,
                                                                                   make_tenant, tmp_path):
    """Found by QA: with ``--workers 2`` and a FLUSHDB under load, a tenant spent 11-16% over its
    budget: the counter was rebuilt from the database while the other worker's rows of the last
    half second were still in its journal."""
    other = await _other(tenancy_settings, tmp_path, usage_flush_interval_s=3600.0)  # rows stay in its journal
    try:
        tenant, key, _ = await make_tenant(budget_tokens=1000, tpm=0)
        p = await tenancy.auth.authenticate(f"Bearer {key}")
        done = await other.quota.reserve(p, model="m", prompt_tokens=10, max_tokens=40)
        await other.quota.settle(done, prompt_tokens=10, completion_tokens=40)
        other.usage.record(UsageEvent(request_id=uuid.uuid4().hex, tenant_id=tenant.id, model="m", status="ok",
                                      prompt_tokens=10, completion_tokens=40))
        keys = [k async for k in tenancy.redis.scan_iter(match=f"{tenancy.settings.redis_prefix}{{t:{tenant.id}}}*")]
        await tenancy.redis.delete(*keys)  # Redis lost (flushed, restarted empty)
        rebuilt = await tenancy.quota.reserve(p, model="m", prompt_tokens=10, max_tokens=1000)
        assert rebuilt.max_tokens == 1000 - 50 - 10  # the other's 50 tokens, from its journal, counted
    finally:
        await other.close()


async def test_processes_on_another_redis_database_are_not_asked(tenancy, redis_prefix):
    """Found by QA: Pub/Sub ignores the database number, so a deployment on another database of
    the same server received every request and answered on its own database, where the asker never
    looked: each refusal waited its whole timeout. The channel names the database."""
    from redis.asyncio import Redis

    from gateway.peer_flush import PeerFlush

    asked: list[bool] = []

    async def bookkeeping(usage: bool) -> None:
        asked.append(usage)

    other_db = Redis.from_url(TENANCY_REDIS_URL.rsplit("/", 1)[0] + "/3")
    same_db = Redis.from_url(TENANCY_REDIS_URL)
    elsewhere, alongside = PeerFlush(other_db, redis_prefix, bookkeeping), PeerFlush(same_db, redis_prefix, bookkeeping)
    await elsewhere.start()
    await alongside.start()
    try:
        assert await tenancy.peers.ask(usage=True, timeout_s=2.0) == 1  # the one on the same database
        assert asked == [True]
    finally:
        for peer in (elsewhere, alongside):
            await peer.close()
        await other_db.aclose()
        await same_db.aclose()


async def test_a_rebuild_waits_for_a_peer_that_is_subscribing_again(tenancy, redis_prefix):
    """Found by QA: right after Redis restarted, the other gateways' listeners had not subscribed
    again, so the rebuild's ask reached nobody and the rebuilt counter missed their unwritten rows.
    An ask for usage rows waits (within its timeout) for as many peers as asks reached lately."""
    from redis.asyncio import Redis

    from gateway.peer_flush import PeerFlush

    asked: list[bool] = []

    async def bookkeeping(usage: bool) -> None:
        asked.append(usage)

    redis = Redis.from_url(TENANCY_REDIS_URL)
    peer = PeerFlush(redis, redis_prefix, bookkeeping)
    await peer.start()
    try:
        asker = PeerFlush(redis, redis_prefix, bookkeeping)  # (not listening itself: it only asks)
        listening = await asker.ask(usage=True, timeout_s=2.0)  # (the fixture's own process listens too)
        assert listening >= 1
        await peer.close()  # its listener gone, as after a Redis restart ...
        late = PeerFlush(redis, redis_prefix, bookkeeping)

        async def subscribe_later() -> None:
            await asyncio.sleep(0.5)  # ... and back half a second later
            await late.start()

        comeback = asyncio.ensure_future(subscribe_later())
        assert await asker.ask(usage=True, timeout_s=3.0) == listening  # waited for it
        await comeback
        assert await asker.ask(usage=False, timeout_s=2.0) == listening
        await late.close()
    finally:
        await peer.close()
        await redis.aclose()


async def test_a_rebuilt_counter_gets_the_other_processes_open_reservations_at_once(tenancy, tenancy_settings,
                                                                                    make_tenant, tmp_path):
    """Found by a recheck QA: after a FLUSHDB, the other gateway charged its open reservations to the
    rebuilt counter only at its next reservation of the tenant; until then the counter missed them,
    and a two-gateway run spent 2,370 tokens of a 1,500 budget. The rebuild now asks the others to
    charge them before its own batch is retried."""
    other = await _other(tenancy_settings, tmp_path)
    try:
        tenant, key, _ = await make_tenant(budget_tokens=1500, tpm=0)
        p = await tenancy.auth.authenticate(f"Bearer {key}")
        running = [await other.quota.reserve(p, model="m", prompt_tokens=35, max_tokens=400) for _ in range(2)]
        keys = [k async for k in tenancy.redis.scan_iter(match=f"{tenancy.settings.redis_prefix}{{t:{tenant.id}}}*")]
        await tenancy.redis.delete(*keys)  # Redis lost (flushed, restarted empty) while the other's requests run
        r = await tenancy.quota.reserve(p, model="m", prompt_tokens=10, max_tokens=1500)
        assert r.max_tokens == 1500 - 2 * 435 - 10  # the other's 870 in flight are in the rebuilt counter
        assert (await tenancy.quota.usage(p.tenant_id))[0] == 1500
        for res in running:  # they end: their real amounts replace what they held, once
            await other.quota.settle(res, prompt_tokens=35, completion_tokens=400)
        await tenancy.quota.settle(r, prompt_tokens=10, completion_tokens=0)
        assert (await tenancy.quota.usage(p.tenant_id))[0] == 2 * 435 + 10
    finally:
        await other.close()


async def test_two_processes_that_find_a_counter_missing_together_rebuild_it_once(tenancy, tenancy_settings,
                                                                                  make_tenant, tmp_path):
    """Found by QA with ``--workers 2`` and Redis restarted under load: both workers rebuilt the
    counter at once. The later one's write was refused, yet it decided from its own sum which of
    its requests that ended meanwhile were counted, and charged one whose row had reached the other's
    sum (through that one's ask) again: counters 67-689 tokens over the rows for the rest of the
    period. Now one process rebuilds (a lock in Redis); the other waits for the counter."""
    from gateway.db.models import UsageRecord

    other = await _other(tenancy_settings, tmp_path, usage_flush_interval_s=3600.0)  # rows stay in its journal
    try:
        tenant, key, _ = await make_tenant(budget_tokens=10_000, tpm=0)
        p = await tenancy.auth.authenticate(f"Bearer {key}")
        running = await other.quota.reserve(p, model="m", prompt_tokens=10, max_tokens=90)
        keys = [k async for k in tenancy.redis.scan_iter(match=f"{tenancy.settings.redis_prefix}{{t:{tenant.id}}}*")]
        await tenancy.redis.delete(*keys)  # Redis lost while the other's request runs
        flushed_first = other.quota._before_rebuild
        rebuilds = []
        first: list[asyncio.Task] = []

        async def flush_then_end_and_race() -> int:
            rebuilds.append("other")
            written = await flushed_first()
            # its request ends now: its row goes to its journal, its settlement waits for the counter
            other.usage.record(UsageEvent(request_id=uuid.uuid4().hex, tenant_id=tenant.id, model="m",
                                          status="ok", prompt_tokens=10, completion_tokens=20))
            other.quota.settle_soon(running, prompt_tokens=10, completion_tokens=20)
            # this process finds the counter missing too, meanwhile
            first.append(asyncio.ensure_future(tenancy.quota.reserve(p, model="m", prompt_tokens=5, max_tokens=5)))
            await asyncio.sleep(0.5)
            return written

        async def counted() -> int:
            rebuilds.append("tenancy")
            return await flushed_this()

        flushed_this = tenancy.quota._before_rebuild
        other.quota._before_rebuild = flush_then_end_and_race
        tenancy.quota._before_rebuild = counted
        mine = await other.quota.reserve(p, model="m", prompt_tokens=5, max_tokens=5)
        theirs = await first[0]
        assert rebuilds == ["other"]  # one rebuild
        for ledger, res in ((other.quota, mine), (tenancy.quota, theirs)):
            await ledger.settle(res, prompt_tokens=5, completion_tokens=5)
        await other.aftercare.drain()
        await other.usage.flush()
        async with tenancy.db.sessionmaker() as s:
            rows = (await s.execute(UsageRecord.__table__.select().where(UsageRecord.tenant_id == tenant.id))).all()
        assert sum(r.prompt_tokens + r.completion_tokens for r in rows) == 30  # the request that ended
        assert (await tenancy.quota.usage(p.tenant_id))[0] == 30 + 2 * 10  # its 30 once, and the two settled
    finally:
        await other.close()


async def test_a_rebuild_lock_left_by_a_dead_process_expires(tenancy, make_tenant):
    """The process holding a counter's rebuild lock died: the lock expires and another rebuilds."""
    import time
    from datetime import UTC, datetime

    from gateway.quota import period_bounds

    tenant, key, _ = await make_tenant(budget_tokens=1000, tpm=0)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    counter = tenancy.quota.counter_key(tenant.id, period_bounds(p.budget_period, datetime.now(UTC))[0])
    await tenancy.redis.delete(counter)
    await tenancy.redis.set(f"{counter}:rebuild", "a-dead-process", px=400)
    t0 = time.monotonic()
    r = await tenancy.quota.reserve(p, model="m", prompt_tokens=10, max_tokens=10)
    assert r.max_tokens == 10 and time.monotonic() - t0 >= 0.3  # waited for the lock, then rebuilt
    assert await tenancy.redis.exists(f"{counter}:rebuild") == 0  # released after the rebuild
    assert (await tenancy.quota.usage(p.tenant_id, p.budget_period))[0] == 20
