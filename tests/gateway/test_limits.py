"""Request-rate limits (moving window on Redis) per key and per tenant."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.errors import ApiError
from gateway.limits import RequestLimiter, format_reset


async def _two_keys(tenancy, make_tenant, *, rpm: int, key_rpm: int):
    """Principals of two keys (``key_rpm`` each) of one new tenant (``rpm``)."""
    from gateway import tenancy as svc

    tenant, key1, _ = await make_tenant(rpm=rpm, key_rpm=key_rpm)
    async with tenancy.db.sessionmaker() as s:
        _, new = await svc.create_api_key(s, tenant_id=tenant.id, rpm=key_rpm)
        await s.commit()
    return (await tenancy.auth.authenticate(f"Bearer {key1}"), await tenancy.auth.authenticate(f"Bearer {new.key}"))


def test_format_reset():
    assert format_reset(0.25) == "250ms"
    assert format_reset(12.1) == "13s"
    assert format_reset(65) == "1m5s"


async def test_key_rpm_enforced_with_headers(tenancy, make_tenant):
    _, key, _ = await make_tenant(rpm=100, key_rpm=3)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    remaining = []
    for _ in range(3):
        h = await tenancy.limiter.check_request(p)
        assert h["x-ratelimit-limit-requests"] == "3"
        remaining.append(int(h["x-ratelimit-remaining-requests"]))
        assert h["x-ratelimit-reset-requests"].endswith("s")
    assert remaining == [2, 1, 0]
    with pytest.raises(ApiError) as e:
        await tenancy.limiter.check_request(p)
    err = e.value
    assert err.status == 429 and err.code == "rate_limit_exceeded"
    assert 1 <= int(err.headers["retry-after"]) <= 60 and int(err.headers["retry-after-ms"]) > 0
    assert err.headers["x-ratelimit-remaining-requests"] == "0"
    assert "API key" in err.message


async def test_a_key_without_its_own_limit_is_refused_by_its_tenants(tenancy, make_tenant):
    """The key inherits the tenant's 3 a minute: the refusal names the organization's limit (the
    one that binds: it counts every key), and the key gets no window of its own in Redis."""
    _, key, _ = await make_tenant(rpm=3)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    assert p.rpm_limit == p.tenant_rpm == 3
    for _ in range(3):
        await tenancy.limiter.check_request(p)
    with pytest.raises(ApiError) as e:
        await tenancy.limiter.check_request(p)
    assert "limit 3 per minute for this organization" in e.value.message
    own = [k async for k in tenancy.redis.scan_iter(match=f"{tenancy.limiter.key_prefix}*/k/{p.key_id}/*")]
    assert own == []


async def test_tenant_rpm_spans_keys_and_limiter_instances(tenancy, make_tenant):
    """Two keys of one tenant, two limiter instances (as two processes): the tenant's 4 rpm hold."""
    from gateway import tenancy as svc

    tenant, key1, _ = await make_tenant(rpm=4)
    async with tenancy.db.sessionmaker() as s:
        _, new = await svc.create_api_key(s, tenant_id=tenant.id, rpm=10)
        await s.commit()
    p1 = await tenancy.auth.authenticate(f"Bearer {key1}")
    p2 = await tenancy.auth.authenticate(f"Bearer {new.key}")
    other = RequestLimiter(tenancy.redis, prefix=tenancy.settings.redis_prefix)
    accepted = refused = 0
    for i in range(8):
        limiter, p = (tenancy.limiter, p1) if i % 2 else (other, p2)
        try:
            await limiter.check_request(p)
            accepted += 1
        except ApiError as e:
            assert e.status == 429
            refused += 1
    assert (accepted, refused) == (4, 4)


async def test_zero_means_unlimited(tenancy, make_tenant):
    _, key, _ = await make_tenant(rpm=0)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    for _ in range(20):
        assert await tenancy.limiter.check_request(p) == {}


async def test_limits_are_isolated_by_prefix(tenancy, make_tenant):
    _, key, _ = await make_tenant(rpm=1)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    await tenancy.limiter.check_request(p)
    elsewhere = RequestLimiter(tenancy.redis, prefix=tenancy.settings.redis_prefix + "x:")
    try:
        await elsewhere.check_request(p)  # another deployment's window: not exhausted
    finally:
        await elsewhere.reset(p)
    keys = [k async for k in tenancy.redis.scan_iter(match=tenancy.settings.redis_prefix + "rl*")]
    assert keys


async def test_a_changed_limit_applies_to_the_same_window(tenancy, make_tenant):
    """The window's key does not hold the limit: lowered from 5 to 4 after 5 requests, the tenant
    gets none until the minute's requests fall under 4 (a key per limit started an empty window:
    9 requests in a minute, a QA find); raised to 7, it gets the 2 that fit at once."""
    from gateway import tenancy as svc

    tenant, key, _ = await make_tenant(rpm=5)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    for _ in range(5):
        await tenancy.limiter.check_request(p)
    lowered = dataclasses.replace(p, tenant_rpm=4, rpm_limit=4)
    with pytest.raises(ApiError) as e:
        await tenancy.limiter.check_request(lowered)
    assert e.value.status == 429 and e.value.headers["x-ratelimit-remaining-requests"] == "0"
    ids = (f"{{t:{p.tenant_id}}}", "t")
    window = tenancy.limiter.window_key(ids)
    stamps = [float(t) for t in await tenancy.redis.lrange(window, 0, -1)]  # newest first
    await tenancy.redis.delete(window)  # the same 5 requests, spread over the last 50 s
    await tenancy.redis.rpush(window, *(repr(stamps[0] - 10 * i) for i in range(5)))
    with pytest.raises(ApiError) as e:
        await tenancy.limiter.check_request(dataclasses.replace(p, tenant_rpm=2, rpm_limit=2))
    # room comes when the 2nd newest (10 s old) expires, not the oldest (40 s old): in ~50 s, not ~20 s
    assert 48 <= float(e.value.headers["retry-after"]) <= 51
    await tenancy.redis.delete(window)
    await tenancy.redis.rpush(window, *(repr(t) for t in stamps))
    raised = dataclasses.replace(p, tenant_rpm=7, rpm_limit=7)
    assert [(await tenancy.limiter.check_request(raised))["x-ratelimit-remaining-requests"]
            for _ in range(2)] == ["1", "0"]
    with pytest.raises(ApiError):
        await tenancy.limiter.check_request(raised)
    async with tenancy.db.sessionmaker() as s:  # through the settings too: one window whatever the limit
        await svc.update_tenant(s, tenant_id=tenant.id, rpm=6)
        await s.commit()
    assert await tenancy.redis.llen(tenancy.limiter.window_key(ids)) == 7
    assert [k async for k in tenancy.redis.scan_iter(match=tenancy.limiter.key_prefix + f"*{{t:{p.tenant_id}}}*")] \
        == [tenancy.limiter.window_key(ids).encode()]


async def test_unreachable_redis_fails_closed_with_503(tenancy, make_tenant):
    import socket

    from redis.asyncio import Redis

    from gateway.quota import QuotaLedger

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_url = f"redis://127.0.0.1:{s.getsockname()[1]}/0"  # nothing listens there
    _, key, _ = await make_tenant(rpm=10, budget_tokens=100)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    dead = Redis.from_url(dead_url, socket_connect_timeout=0.5)
    try:
        with pytest.raises(ApiError) as e:
            await RequestLimiter(dead, prefix=tenancy.settings.redis_prefix).check_request(p)
        assert e.value.status == 503 and e.value.code == "store_unavailable"
        ledger = QuotaLedger(dead, tenancy.db.sessionmaker, tenancy.prices, prefix=tenancy.settings.redis_prefix)
        with pytest.raises(ApiError) as e:
            await ledger.reserve(p, model="m", prompt_tokens=1, max_tokens=1)
        assert e.value.status == 503
    finally:
        await dead.aclose()


async def test_refusal_consumes_nothing(tenancy, make_tenant):
    """All or nothing: a request the tenant window refuses does not use up the key's window."""
    p1, p2 = await _two_keys(tenancy, make_tenant, rpm=2, key_rpm=3)
    await tenancy.limiter.check_request(p2)
    await tenancy.limiter.check_request(p2)  # the tenant's 2 are used up by key 2
    for _ in range(3):
        with pytest.raises(ApiError) as e:
            await tenancy.limiter.check_request(p1)
        assert "organization" in e.value.message
    await tenancy.limiter.reset(p2)  # clears key 2's and the tenant's windows, not key 1's
    h = await tenancy.limiter.check_request(p1)
    assert h["x-ratelimit-limit-requests"] == "2"  # the tenant is the tighter window
    await tenancy.limiter.check_request(p1)
    with pytest.raises(ApiError):
        await tenancy.limiter.check_request(p1)  # tenant full again; key 1 still has 1 of 3 left


async def test_expired_entries_are_dropped_and_never_count(tenancy, make_tenant):
    """Entries older than the window (left by earlier minutes) are popped from the list's old end:
    they neither count nor refuse, and the list keeps only the window's requests."""
    import time

    _, key, _ = await make_tenant(rpm=50, key_rpm=3)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    ids = (f"{{t:{p.tenant_id}}}", "k", str(p.key_id))
    redis_key = tenancy.limiter.window_key(ids)
    now = time.time()
    inside = now - 30
    await tenancy.redis.rpush(redis_key, repr(inside), *(repr(now - 120 - i) for i in range(5)))  # newest first
    h = await tenancy.limiter.check_request(p)
    assert h["x-ratelimit-remaining-requests"] == "1"  # the one inside the window and this one
    assert 29 <= float(h["x-ratelimit-reset-requests"].rstrip("s")) <= 31  # the oldest inside sets the reset
    assert await tenancy.redis.llen(redis_key) == 2


async def test_a_long_expired_burst_is_cut_off_at_once(tenancy, make_tenant):
    """Hundreds of entries from a minute ago: one call drops them all (popped a few, the rest cut
    at the window's boundary), keeping exactly the entries still inside the window."""
    import time

    _, key, _ = await make_tenant(rpm=10_000, key_rpm=1000)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    ids = (f"{{t:{p.tenant_id}}}", "k", str(p.key_id))
    redis_key = tenancy.limiter.window_key(ids)
    now = time.time()
    inside = [repr(now - 1 - i * 0.01) for i in range(7)]  # newest first
    expired = [repr(now - 61 - i * 0.01) for i in range(500)]
    await tenancy.redis.rpush(redis_key, *inside, *expired)
    h = await tenancy.limiter.check_request(p)
    assert h["x-ratelimit-remaining-requests"] == str(1000 - 8)
    assert await tenancy.redis.llen(redis_key) == 8
    assert float((await tenancy.redis.lindex(redis_key, -1)).decode()) == float(inside[-1])
    await tenancy.redis.delete(redis_key)  # only expired entries: the window starts empty
    await tenancy.redis.rpush(redis_key, *expired)
    h = await tenancy.limiter.check_request(p)
    assert h["x-ratelimit-remaining-requests"] == str(1000 - 1)
    assert await tenancy.redis.llen(redis_key) == 1


async def test_concurrent_requests_are_taken_in_one_batch_exactly_as_one_by_one(tenancy, make_tenant):
    """50 requests of one key in one event-loop iteration: one script call takes them in order,
    so exactly the limit gets in, each with its own remaining count, and the rest are refused."""
    import asyncio

    _, key, _ = await make_tenant(rpm=1000, key_rpm=10)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    results = await asyncio.gather(*(tenancy.limiter.check_request(p) for _ in range(50)), return_exceptions=True)
    admitted = [r for r in results if isinstance(r, dict)]
    refused = [r for r in results if isinstance(r, ApiError)]
    assert len(admitted) == 10 and len(refused) == 40
    assert sorted(int(h["x-ratelimit-remaining-requests"]) for h in admitted) == list(range(10))
    assert all(e.status == 429 and "API key" in e.message and e.headers["x-ratelimit-remaining-requests"] == "0"
               for e in refused)
    with pytest.raises(ApiError):
        await tenancy.limiter.check_request(p)  # and the window stays full


async def test_two_keys_batched_together_share_the_tenant_window(tenancy, make_tenant):
    import asyncio

    p1, p2 = await _two_keys(tenancy, make_tenant, rpm=6, key_rpm=100)
    results = await asyncio.gather(*(tenancy.limiter.check_request(p) for p in [p1, p2] * 10), return_exceptions=True)
    assert sum(isinstance(r, dict) for r in results) == 6
    assert all("organization" in r.message for r in results if isinstance(r, ApiError))


@pytest.mark.parametrize("limits_before", [
    [(10, 0)], [(10, 3), (100, 3)], [(100, 50), (60, 0)], [(7, 2), (7, 2)], [(1000, 999), (5, 0)],
])
def test_admitted_part_of_a_batch_matches_one_by_one_outcomes(limits_before):
    """The fast path for a batch's admitted requests gives exactly the per-request outcomes."""
    from gateway.limits import RequestLimiter

    windows = [(scope, (), limit) for scope, (limit, _) in zip(["API key", "organization"][:len(limits_before)], limits_before, strict=True)]
    before = [count for _, count in limits_before]
    resets = [12.5, 61.0][:len(windows)]
    room = min(limit - count for limit, count in limits_before)
    for taken in range(0, room + 1):
        fast = RequestLimiter._admitted(windows, before, resets, taken)
        slow = [RequestLimiter._outcome(windows, before, resets, i, taken) for i in range(taken)]
        assert fast == slow


def test_a_store_refusal_logs_its_cause_once_per_spell(caplog) -> None:
    """Found by QA: Redis out of memory refused 318 requests with 503 in 14 s and the log said
    nothing. The cause is logged, one line per store per 10 s."""
    import logging

    from redis.exceptions import ResponseError

    from gateway import limits

    limits._STORE_LOGS.clear()
    cause = ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
    with caplog.at_level(logging.WARNING, logger="pagegate.limits"):
        for _ in range(50):
            err = limits.store_unavailable("quota", cause=cause)
            assert (err.status, err.code) == (503, "store_unavailable")
        limits.store_unavailable("rate-limit", cause=cause)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "quota store unavailable" in lines[0] and "OOM command not allowed" in lines[0]
    assert "rate-limit store unavailable" in lines[1]
