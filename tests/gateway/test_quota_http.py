"""Quota under concurrency, end to end over HTTP with the official openai client and the real
engine: 50 concurrent requests against a budget that covers 10 never overspend, and every
reservation is reconciled with the real token counts, also when streams are aborted."""

from __future__ import annotations

import asyncio

import openai
import pytest
from redis.asyncio import Redis

pytestmark = pytest.mark.slow  # the session's gateway holds the real engine

MESSAGES = [{"role": "user", "content": "Count to twenty."}]


async def _ledger_state(api, tenant_id: int) -> tuple[int, list[bytes]]:
    """(tokens charged in Redis this period, open reservation keys) for a tenant."""
    from gateway.quota import period_bounds

    prefix = api.settings.redis_prefix
    from datetime import UTC, datetime

    period_id = period_bounds("month", datetime.now(UTC))[0]
    r = Redis.from_url(api.settings.redis_url)
    try:
        tok = await r.hget(f"{prefix}{{t:{tenant_id}}}:q:{period_id}", "tok")
        open_keys = await r.hkeys(f"{prefix}{{t:{tenant_id}}}:res")
    finally:
        await r.aclose()
    return int(tok or 0), open_keys


def _row_tokens(api, tenant_id: int) -> tuple[int, list]:
    rows = [r for r in api.usage_rows() if r.tenant_id == tenant_id]
    return sum(r.prompt_tokens + r.completion_tokens for r in rows), rows


async def test_50_concurrent_requests_never_exceed_a_budget_of_10(api):
    probe = await api.async_openai().chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=1)
    prompt_tokens = probe.usage.prompt_tokens
    per_request = prompt_tokens + 8
    budget = 10 * per_request
    tenant_id, key = api.make_tenant(budget_tokens=budget, tpm=0)
    client = api.async_openai(key=key)

    async def one():
        try:
            r = await client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=8,
                                                     extra_body={"ignore_eos": True})
            return r.usage.prompt_tokens + r.usage.completion_tokens
        except openai.RateLimitError as e:  # room held by requests in flight, or spent by those finished
            assert e.code in ("rate_limit_exceeded", "insufficient_quota"), e
            if e.code == "rate_limit_exceeded":
                assert "in flight" in e.message and e.response.headers["retry-after"] == "1", e
            else:
                assert e.response.headers["x-should-retry"] == "false", e  # the month ends days later
            return None

    results = await asyncio.gather(*(one() for _ in range(50)))
    served = [t for t in results if t is not None]
    assert 10 <= len(served) < 50
    assert sum(served) <= budget
    api.settle_pending()  # settlements run ~20 ms after each response (gateway/aftercare.py)
    charged, open_keys = await _ledger_state(api, tenant_id)
    assert open_keys == []  # every reservation settled
    rows_tokens, rows = _row_tokens(api, tenant_id)
    assert len([r for r in rows if r.status == "ok"]) == len(served)
    assert charged == rows_tokens == sum(served) <= budget
    with pytest.raises(openai.RateLimitError) as out:  # exhausted now, nothing in flight
        await client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=1)
    assert out.value.code == "insufficient_quota"


async def test_aborted_streams_are_reconciled_with_real_counts(api):
    tenant_id, key = api.make_tenant(budget_tokens=100_000, tpm=0)
    client = api.async_openai(key=key)

    async def abort_after_two_chunks():
        stream = await client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=400,
                                                      stream=True, extra_body={"ignore_eos": True})
        seen = 0
        async for _chunk in stream:
            seen += 1
            if seen >= 3:
                break
        await stream.close()  # client disconnects mid-stream

    await asyncio.gather(*(abort_after_two_chunks() for _ in range(5)))
    for _ in range(100):  # the gateway notices the disconnects and settles
        charged, open_keys = await _ledger_state(api, tenant_id)
        rows_tokens, rows = _row_tokens(api, tenant_id)
        if not open_keys and len(rows) == 5:
            break
        await asyncio.sleep(0.1)
    assert open_keys == [] and len(rows) == 5
    assert charged == rows_tokens
    assert all(r.completion_tokens < 400 for r in rows)  # charged what was generated, not the reservation
    assert charged < 5 * 400


async def _admin_update(api, tenant_id: int, **changes) -> None:
    """Change a tenant as the admin API and CLI do (``admin.management``: commit, counters, push)."""
    from admin.management import Management
    from gateway.db.models import Tenant

    redis = Redis.from_url(api.settings.redis_url)
    try:
        async with api.services.db.sessionmaker() as session:
            name = (await session.get(Tenant, tenant_id)).name
            ops = Management(session=session, actor="test", redis=redis, redis_prefix=api.settings.redis_prefix)
            await ops.update_tenant(name, **changes)
            assert not ops.invalidation_failed
    finally:
        await redis.aclose()


async def test_a_budget_period_switched_back_counts_what_was_spent_meanwhile(api):
    """Month, then day, then month again: the month's counter in Redis, left while the day's was
    charged, is rebuilt from the usage rows, so the request that the whole spend exhausts is refused
    (it was admitted: the month counter had missed the day's spend, a QA find)."""
    tenant_id, key = api.make_tenant(budget_tokens=100_000, tpm=0)
    client = api.async_openai(key=key)

    async def spend() -> int:
        r = await client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=2,
                                                 extra_body={"ignore_eos": True})
        api.settle_pending()
        return r.usage.total_tokens

    async def until_seen(field: str, value) -> None:  # noqa: ANN001 - the gateway's key cache took the change
        for _ in range(100):
            principal = api.loop.run(api.services.auth.authenticate(f"Bearer {key}"))
            if getattr(principal, field) == value:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the gateway never saw {field}={value}")

    spent = await spend()  # charged to the month's counter
    await _admin_update(api, tenant_id, period="day")
    await until_seen("budget_period", "day")
    spent += await spend()  # charged to the day's counter only
    await _admin_update(api, tenant_id, period="month")
    await until_seen("budget_period", "month")
    api.usage_rows()  # (the rows are in the database, as the rebuild reads them)
    await _admin_update(api, tenant_id, budget_tokens=spent + 1)  # room for a prompt, not for it and 1 token
    await until_seen("budget_tokens", spent + 1)
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=2)
    assert refused.value.code == "insufficient_quota"
    charged, open_keys = await _ledger_state(api, tenant_id)
    assert (charged, open_keys) == (spent, [])
