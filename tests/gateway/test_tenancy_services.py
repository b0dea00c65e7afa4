"""Tenant/key/price service functions and the embedded Redis server."""

from __future__ import annotations

from decimal import Decimal

import pytest
from redis.asyncio import Redis

from gateway import tenancy as svc
from gateway.keys import hash_key
from gateway.redis_server import EmbeddedRedis, _running


async def test_tenant_and_key_lifecycle(tenancy):
    async with tenancy.db.sessionmaker() as s:
        t = await svc.create_tenant(s, name="acme", rpm=60, tpm=1000, budget_usd="12.5", period="day")
        with pytest.raises(svc.TenantExists):  # a TenancyError the admin surfaces answer with 409
            await svc.create_tenant(s, name="acme")
        with pytest.raises(svc.TenancyError):
            await svc.create_tenant(s, name="bad", period="week")
        row, new = await svc.create_api_key(s, tenant_name="acme", name="ci", allowed_models=["a", "b"])
        await s.commit()
    assert new.key.startswith("pg-") and row.key_hash == hash_key(new.key) and row.prefix == new.key[:10]
    assert new.key not in repr(row.__dict__)  # only the hash is stored
    async with tenancy.db.sessionmaker() as s:
        got = await svc.get_tenant(s, name="acme")
        assert (got.id, got.budget_usd, got.budget_period) == (t.id, Decimal("12.5"), "day")
        await svc.update_tenant(s, tenant_id=t.id, rpm=0, budget_tokens=5)
        with pytest.raises(svc.TenancyError):
            await svc.update_tenant(s, tenant_id=t.id, nonsense=1)
        revoked = await svc.revoke_key(s, prefix=row.prefix)
        assert revoked.revoked and revoked.revoked_at is not None
        assert [k.id for k in await svc.list_keys(s, tenant_id=t.id)] == [row.id]
        with pytest.raises(svc.TenancyError):
            await svc.create_api_key(s, tenant_name="nobody")
        await s.commit()
    async with tenancy.db.sessionmaker() as s:
        got = await svc.get_tenant(s, tenant_id=t.id)
        assert (got.rpm_limit, got.budget_tokens) == (0, 5)


async def test_revoke_active_key_revokes_once(make_tenant, tenancy):
    """The conditional UPDATE behind the admin's revoke and rotate: True only for the call that revoked."""
    _, _, row = await make_tenant()
    async with tenancy.db.sessionmaker() as s:
        assert await svc.revoke_active_key(s, key_id=row.id) is True
        assert await svc.revoke_active_key(s, key_id=row.id) is False
        await s.commit()
    async with tenancy.db.sessionmaker() as s:
        assert await svc.revoke_active_key(s, key_id=row.id) is False
        revoked = await svc.revoke_key(s, key_id=row.id)  # the service's revoke of a revoked key: unchanged
        first_revoked_at = revoked.revoked_at
        assert revoked.revoked and first_revoked_at is not None
        assert (await svc.revoke_key(s, key_id=row.id)).revoked_at == first_revoked_at


async def test_set_price_upserts(tenancy):
    async with tenancy.db.sessionmaker() as s:
        await svc.set_price(s, model="m", prompt_usd_per_1m="0.5", completion_usd_per_1m=1)
        await svc.set_price(s, model="m", prompt_usd_per_1m="0.25", completion_usd_per_1m="0.75")
        await s.commit()
    tenancy.prices.invalidate()
    assert await tenancy.prices.cost("m", 1_000_000, 2_000_000) == Decimal("1.75")


async def test_bootstrap_dev_tenant_only_on_an_empty_database(tenancy):
    async with tenancy.db.sessionmaker() as s:
        name, key = await svc.bootstrap_dev_tenant(s)
        await s.commit()
    assert name == "default" and key.startswith("pg-")
    assert (await tenancy.auth.authenticate(f"Bearer {key}")).tenant_name == "default"
    async with tenancy.db.sessionmaker() as s:
        assert await svc.bootstrap_dev_tenant(s) is None
    # its only tenant deleted (the name stays taken): the next dev start makes default-2
    from datetime import UTC, datetime

    async with tenancy.db.sessionmaker() as s:
        await svc.update_tenant(s, tenant_name="default", deleted_at=datetime.now(UTC))
        name2, key2 = await svc.bootstrap_dev_tenant(s)
        await s.commit()
    assert name2 == "default-2"  # the name the dev banner prints
    assert (await tenancy.auth.authenticate(f"Bearer {key2}")).tenant_name == "default-2"


async def test_publish_invalidation_bumps_version_and_publishes(tenancy):
    prefix = tenancy.settings.redis_prefix
    pubsub = tenancy.redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(svc.invalidation_channel(prefix, tenancy.redis))
    try:
        await svc.publish_invalidation(tenancy.redis, prefix, tenant_id=42)
        msg = None
        for _ in range(20):  # the first read may only consume the subscribe confirmation
            msg = await pubsub.get_message(timeout=0.2)
            if msg is not None:
                break
        assert msg is not None and msg["data"] == b"tenant:42"
        assert int(await tenancy.redis.get(svc.invalidation_version_key(prefix))) >= 1
    finally:
        await pubsub.aclose()


async def test_embedded_redis_starts_persists_and_stops(tmp_path):
    server = EmbeddedRedis(tmp_path)
    url = await __import__("asyncio").to_thread(server.start)
    r = Redis.from_url(url)
    try:
        await r.set("k", "v")
        await r.save()
    finally:
        await r.aclose()
        await r.connection_pool.disconnect()
    server.stop()
    assert (tmp_path / "redis" / "pagegate.rdb").exists()
    again = EmbeddedRedis(tmp_path)
    url2 = again.start()
    r = Redis.from_url(url2)
    try:
        assert await r.get("k") == b"v"  # the snapshot under data_dir survived the restart
    finally:
        await r.aclose()
        await r.connection_pool.disconnect()
        again.stop()


def test_embedded_redis_stop_ends_the_server_even_with_clients_connected(tmp_path):
    import redis

    server = EmbeddedRedis(tmp_path)
    url = server.start()
    pid = server._lite.pid
    client = redis.Redis.from_url(url)
    client.ping()  # a client that never disconnects (e.g. a leaked pool)
    server.stop()
    assert not _running(pid)  # the process has exited (a zombie waiting for init counts as gone)
    client.close()


async def test_allowed_models_empty_is_refused_and_names_are_stored_as_checked(tenancy):
    """Only None means "all models" (an empty list used to become None); a tenant name is never
    stripped after its duplicate check ("acme\n" was stored as "acme")."""
    async with tenancy.db.sessionmaker() as s:
        t = await svc.create_tenant(s, name="models")
        for models in ([], [""], ["a", " "]):
            with pytest.raises(svc.TenancyError, match="allowed_models"):
                await svc.create_api_key(s, tenant_id=t.id, allowed_models=models)
        row, _ = await svc.create_api_key(s, tenant_id=t.id, allowed_models=None)
        assert row.allowed_models is None
        for name in ("models\n", " models", "fresh\n", ""):
            with pytest.raises(svc.TenancyError):
                await svc.create_tenant(s, name=name)
        assert await svc.get_tenant(s, name="fresh") is None
        assert [k.id for k in await svc.list_keys(s, tenant_id=t.id)] == [row.id]
