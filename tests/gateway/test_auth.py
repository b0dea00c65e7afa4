"""API-key authentication against real Redis and both databases."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from gateway import tenancy as svc
from gateway.auth import Authenticator
from gateway.errors import ApiError
from gateway.keys import generate_key


async def test_valid_key_resolves_principal_with_defaults(tenancy, make_tenant):
    tenant, key, row = await make_tenant(rpm=None, tpm=1234, budget_tokens=500, period="day",
                                         allowed_models=["m1"])
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    assert (p.tenant_id, p.tenant_name, p.key_id, p.key_prefix) == (tenant.id, tenant.name, row.id, key[:10])
    assert p.rpm_limit == p.tenant_rpm == tenancy.settings.default_rpm  # None: the settings' default
    assert p.tpm_limit == 1234 and p.budget_tokens == 500 and p.budget_period == "day"
    assert p.allowed_models == ["m1"] and p.may_use("m1") and not p.may_use("m2")
    assert p.cache_threshold == tenancy.settings.cache_threshold


async def test_key_rpm_overrides_tenant_rpm(tenancy, make_tenant):
    _, key, _ = await make_tenant(rpm=100, key_rpm=7)
    p = await tenancy.auth.authenticate(f"Bearer {key}")
    assert (p.rpm_limit, p.tenant_rpm) == (7, 100)


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic abc", "Bearer sk-not-ours",
                                    f"Bearer {generate_key().key}"])
async def test_missing_or_unknown_key_is_401(tenancy, header):
    with pytest.raises(ApiError) as e:
        await tenancy.auth.authenticate(header)
    assert e.value.status == 401 and e.value.code == "invalid_api_key"


@pytest.mark.parametrize(("header", "query", "says"), [
    (None, b"", "You didn't provide an API key."),
    ("Bearer", b"", "no API key after 'Bearer'"),
    ("Basic dXNlcjpwZy1zZWNyZXQ=", b"", "uses the 'Basic' scheme; API keys are sent as a Bearer token"),
    ("Tok\u00e9n abc", b"", "holds no 'Bearer' scheme"),
    ("pg-0123456789abcdef0123456789", b"", "holds no 'Bearer' scheme"),  # (a bare key: not echoed, a review's find)
    (None, b"model=x&api_key=pg-abc", "API keys are not read from the URL"),
])
async def test_a_request_without_a_key_is_told_what_it_sent(tenancy, header, query, says):
    """Found by QA: a ``Basic`` header and a key in the URL were both told no key was sent."""
    with pytest.raises(ApiError) as e:
        await tenancy.auth.authenticate(header, query_string=query)
    assert e.value.status == 401 and e.value.code == "invalid_api_key"
    assert says in e.value.message and "Authorization: Bearer pg-..." in e.value.message
    assert "dXNlcjpwZy1zZWNyZXQ" not in e.value.message and "pg-abc" not in e.value.message
    assert "0123456789" not in e.value.message


async def test_revoked_key_and_disabled_tenant(tenancy, make_tenant):
    tenant, key, row = await make_tenant()
    _, key2, _ = await make_tenant()
    await tenancy.auth.authenticate(f"Bearer {key}")  # cached now
    async with tenancy.db.sessionmaker() as s:
        await svc.revoke_key(s, key_id=row.id)
        await s.commit()
    await tenancy.auth.invalidate_key(row.key_hash)
    with pytest.raises(ApiError) as e:
        await tenancy.auth.authenticate(f"Bearer {key}")
    assert e.value.status == 401

    await tenancy.auth.authenticate(f"Bearer {key2}")
    async with tenancy.db.sessionmaker() as s:
        t2 = await svc.get_tenant(s, name=(await tenancy.auth.authenticate(f"Bearer {key2}")).tenant_name)
        await svc.set_tenant_enabled(s, tenant_id=t2.id, enabled=False)
        await s.commit()
    await tenancy.auth.invalidate_tenant(t2.id)
    with pytest.raises(ApiError) as e:
        await tenancy.auth.authenticate(f"Bearer {key2}")
    assert e.value.status == 403 and e.value.code == "tenant_disabled"


async def test_a_deleted_tenants_keys_are_unknown_even_if_one_escaped_revocation(tenancy, make_tenant):
    """Defence in depth: a key of a deleted tenant is refused (401) whatever its own row says."""
    from datetime import UTC, datetime

    tenant, key, _ = await make_tenant()
    async with tenancy.db.sessionmaker() as s:
        await svc.update_tenant(s, tenant_id=tenant.id, deleted_at=datetime.now(UTC))  # its key left active
        await s.commit()
    await tenancy.auth.invalidate_tenant(tenant.id)
    with pytest.raises(ApiError) as e:
        await tenancy.auth.authenticate(f"Bearer {key}")
    assert e.value.status == 401


async def _refused_within(auth: Authenticator, header: str, limit_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        try:
            await auth.authenticate(header)
        except ApiError:
            return time.monotonic() - start
        await asyncio.sleep(0.01)
    raise AssertionError(f"still accepted after {limit_s}s")


async def test_revocation_reaches_another_instance_within_1s(tenancy, make_tenant):
    """Two Authenticators (as in two processes) share only Redis and the DB."""
    other = Authenticator(tenancy.db.sessionmaker, tenancy.redis, tenancy.settings)
    await other.start()
    try:
        _, key, row = await make_tenant()
        await other.authenticate(f"Bearer {key}")  # cached in `other` for key_cache_ttl_s (30 s)
        async with tenancy.db.sessionmaker() as s:
            await svc.revoke_key(s, key_id=row.id)
            await s.commit()
        await svc.publish_invalidation(tenancy.redis, tenancy.settings.redis_prefix, key_hash=row.key_hash)
        assert await _refused_within(other, f"Bearer {key}", 1.0) < 1.0
    finally:
        await other.close()


async def test_an_invalidation_reaches_only_the_gateways_of_its_redis_database(tenancy):
    """Redis delivers a message to every subscriber of the server whatever database it selected:
    found by QA, a deployment on another database with the same prefix dropped its cache entries
    and was counted as a gateway that heard, so the CLI's "no gateway heard it" warning stayed
    silent. The channel carries the database number."""
    from redis.asyncio import Redis

    prefix = tenancy.settings.redis_prefix
    here = tenancy.redis
    db = here.connection_pool.connection_kwargs.get("db", 0)
    elsewhere = Redis.from_url(tenancy.settings.redis_url.rsplit("/", 1)[0] + f"/{15 if db != 15 else 14}")
    listener = Authenticator(tenancy.db.sessionmaker, elsewhere, tenancy.settings)
    await listener.start()
    try:
        assert await svc.publish_invalidation(here, prefix, tenant_id=1) == 1  # this process's own listener
        assert await svc.publish_invalidation(elsewhere, prefix, tenant_id=1) == 1  # the other database's
    finally:
        await listener.close()
        await elsewhere.delete(svc.invalidation_version_key(prefix))
        await elsewhere.aclose()


async def test_version_poll_catches_a_lost_message(tenancy, make_tenant):
    """No listener (as if the pub/sub message was lost): the version counter still invalidates."""
    other = Authenticator(tenancy.db.sessionmaker, tenancy.redis, tenancy.settings)  # not started
    tenant, key, _ = await make_tenant()
    await other.authenticate(f"Bearer {key}")
    async with tenancy.db.sessionmaker() as s:
        await svc.set_tenant_enabled(s, tenant_id=tenant.id, enabled=False)
        await s.commit()
    await svc.publish_invalidation(tenancy.redis, tenancy.settings.redis_prefix, tenant_id=tenant.id)
    assert await _refused_within(other, f"Bearer {key}", 1.0) < 1.0


async def test_database_unreachable_is_503_for_unknown_keys_and_stale_cache_for_known(tenancy, make_tenant,
                                                                                         tmp_path):
    from gateway.db.session import Database

    _, key, _ = await make_tenant()
    auth = Authenticator(tenancy.db.sessionmaker, tenancy.redis, tenancy.settings)
    await auth.authenticate(f"Bearer {key}")
    broken = Database(f"sqlite+aiosqlite:///{tmp_path / 'no-such-dir' / 'x.db'}")
    shutil.rmtree(tmp_path / "no-such-dir")  # (with the empty, owner-only file Database made there)
    (tmp_path / "no-such-dir").write_text("not a directory")
    auth._sessionmaker = broken.sessionmaker  # the database goes away
    for entry in auth._cache.values():
        entry.expires_at = 0  # and the cached entry is due for a reload
    try:
        assert (await auth.authenticate(f"Bearer {key}")).tenant_id  # served from the stale entry
        with pytest.raises(ApiError) as e:
            await auth.authenticate(f"Bearer {generate_key().key}")
        assert e.value.status == 503 and e.value.code == "auth_unavailable"
    finally:
        await broken.dispose()


async def test_a_key_asked_for_by_many_requests_at_once_is_loaded_once(tenancy, make_tenant):
    _, key, _ = await make_tenant()
    auth = Authenticator(tenancy.db.sessionmaker, tenancy.redis, tenancy.settings)
    loads = 0
    load = auth._load

    async def counted(key_hash):
        nonlocal loads
        loads += 1
        return await load(key_hash)

    auth._load = counted
    try:
        principals = await asyncio.gather(*(auth.authenticate(f"Bearer {key}") for _ in range(30)))
        assert loads == 1 and len({p.key_id for p in principals}) == 1
    finally:
        await auth.close()


async def test_a_principal_past_its_ttl_is_served_while_one_background_load_replaces_it(tenancy, make_tenant):
    """No request waits for the periodic reload: the stale principal answers, one load renews it."""
    tenant, key, _ = await make_tenant(rpm=10)
    auth = Authenticator(tenancy.db.sessionmaker, tenancy.redis, tenancy.settings)
    try:
        assert (await auth.authenticate(f"Bearer {key}")).tenant_rpm == 10
        async with tenancy.db.sessionmaker() as s:  # changed without an invalidation: seen on reload
            await svc.update_tenant(s, tenant_id=tenant.id, rpm=20)
            await s.commit()
        for entry in auth._cache.values():
            entry.expires_at = 0
        loads = 0
        load = auth._load

        async def slow(key_hash):
            nonlocal loads
            loads += 1
            await asyncio.sleep(0.2)
            return await load(key_hash)

        auth._load = slow
        started = time.monotonic()
        stale = await asyncio.gather(*(auth.authenticate(f"Bearer {key}") for _ in range(10)))
        assert time.monotonic() - started < 0.1 and {p.tenant_rpm for p in stale} == {10}
        for _ in range(100):
            if (await auth.authenticate(f"Bearer {key}")).tenant_rpm == 20:
                break
            await asyncio.sleep(0.01)
        assert (await auth.authenticate(f"Bearer {key}")).tenant_rpm == 20 and loads == 1
    finally:
        await auth.close()


async def test_prices_past_their_ttl_are_served_while_the_table_reloads(tenancy):
    from decimal import Decimal

    from gateway.pricing import PriceBook

    async with tenancy.db.sessionmaker() as s:
        await svc.set_price(s, model="pm", prompt_usd_per_1m="1", completion_usd_per_1m="2")
        await s.commit()
    book = PriceBook(tenancy.db.sessionmaker, ttl_s=0.05)
    try:
        assert (await book.get("pm")).prompt_usd_per_1m == Decimal(1)  # the first load is waited for
        async with tenancy.db.sessionmaker() as s:
            await svc.set_price(s, model="pm", prompt_usd_per_1m="3", completion_usd_per_1m="4")
            await s.commit()
        await asyncio.sleep(0.06)
        assert (await book.get("pm")).prompt_usd_per_1m == Decimal(1)  # stale, answered at once
        for _ in range(100):
            if (await book.get("pm")).prompt_usd_per_1m == Decimal(3):
                break
            await asyncio.sleep(0.01)
        assert (await book.get("pm")).prompt_usd_per_1m == Decimal(3)
        book.invalidate()  # after set_price in this process: the next get waits for the table
        assert (await book.get("pm")).completion_usd_per_1m == Decimal(4)
    finally:
        await book.aclose()


async def test_a_started_price_book_rereads_the_table_while_idle(tenancy):
    """An idle process's first request after a price change gets the new price (it was the old
    one, then a refresh: a QA find with a 64-prompt batch billed at the old price)."""
    from decimal import Decimal

    from gateway.pricing import PriceBook

    async with tenancy.db.sessionmaker() as s:
        await svc.set_price(s, model="idle-pm", prompt_usd_per_1m="1", completion_usd_per_1m="2")
        await s.commit()
    book = PriceBook(tenancy.db.sessionmaker, ttl_s=0.05)
    try:
        assert (await book.get("idle-pm")).prompt_usd_per_1m == Decimal(1)
        book.start()
        async with tenancy.db.sessionmaker() as s:
            await svc.set_price(s, model="idle-pm", prompt_usd_per_1m="5", completion_usd_per_1m="6")
            await s.commit()
        for _ in range(100):  # no request meanwhile: the ticker re-reads
            await asyncio.sleep(0.01)
            if book._prices["idle-pm"].prompt_usd_per_1m == Decimal(5):
                break
        assert book.get_now("idle-pm").prompt_usd_per_1m == Decimal(5)  # the first request's price
    finally:
        await book.aclose()
    assert book._ticker is None


async def test_redis_away_is_one_warning_line_per_kind_not_a_traceback_per_retry(caplog):
    """The invalidation listener retries every 0.5 s while Redis is away, and every request reads
    the version: one WARNING line (no traceback) per kind of failure, throttled; tracebacks at DEBUG."""
    import logging
    import socket

    from redis.asyncio import Redis

    from gateway.settings import Settings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    redis = Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5)
    auth = Authenticator(None, redis, Settings())  # no database needed: only Redis is used here
    drops = []
    auth._drop = drops.append  # the listener drops the cache on each failure: counts its retries
    with caplog.at_level(logging.DEBUG, logger="gateway.auth"):
        await auth.start()  # gives up waiting for the subscription after 2 s
        for _ in range(5):
            await auth._check_version()
        await auth.close()
    await redis.aclose()
    assert len(drops) >= 3  # the listener retried several times...
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, [r.getMessage() for r in warnings]  # ...and each failure kind was said once
    assert "invalidation listener lost Redis" in warnings[0].getMessage()
    assert "cannot read the invalidation version" in warnings[1].getMessage()
    assert all("ConnectionError" in r.getMessage() and not r.exc_info for r in warnings)
    assert [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]


async def test_still_valid_follows_revocations_and_disabled_tenants(tenancy, make_tenant):
    """What the semantic cache asks before it stores a finished request's answer (found by a review:
    a request running while its tenant was deleted stored its answer after the purge)."""
    tenant, key, row = await make_tenant()
    principal = await tenancy.auth.authenticate(f"Bearer {key}")
    assert await tenancy.auth.still_valid(principal)
    async with tenancy.db.sessionmaker() as s:
        await svc.set_tenant_enabled(s, tenant_id=tenant.id, enabled=False)
        await s.commit()
    await tenancy.auth.invalidate_tenant(tenant.id)
    assert not await tenancy.auth.still_valid(principal)
    async with tenancy.db.sessionmaker() as s:
        await svc.set_tenant_enabled(s, tenant_id=tenant.id, enabled=True)
        await svc.revoke_key(s, key_id=row.id)
        await s.commit()
    await tenancy.auth.invalidate_tenant(tenant.id)
    assert not await tenancy.auth.still_valid(principal)
