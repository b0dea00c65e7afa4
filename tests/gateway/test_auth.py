"""API-key authentication against real Redis and both databases."""

from __future__ import annotations

import asyncio
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
    (tmp_path / "no-such-dir").rmdir()
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
