"""Admin API resources against real SQLite/PostgreSQL and Redis: tenants, budgets, keys, prices,
the audit trail and Redis invalidations."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from admin_testlib import unique, usage_row
from redis.asyncio import Redis
from sqlalchemy import select

from gateway.db.models import ApiKey, AuditLog, Tenant
from gateway.keys import hash_key
from gateway.tenancy import invalidation_channel


async def _audit(app, action: str, target: str) -> list[AuditLog]:
    async with app.state.admin_context.database.sessionmaker() as s:
        rows = await s.execute(select(AuditLog).where(AuditLog.action == action, AuditLog.target == target))
        return list(rows.scalars())


async def test_tenant_lifecycle_and_audit(client, app, auth):
    name = unique("acme")
    resp = await client.post("/admin/v1/tenants", headers=auth(sub="carol"),
                             json={"name": name, "rpm": 60, "tpm": 5000, "budget_usd": "12.5", "period": "day"})
    assert resp.status_code == 201, resp.text
    created = resp.json()
    assert (created["name"], created["rpm"], created["tpm"], created["budget_usd"], created["period"]) == (
        name, 60, 5000, 12.5, "day")
    assert created["enabled"] is True

    listed = (await client.get("/admin/v1/tenants", headers=auth("admin:read"))).json()["data"]
    assert name in [t["name"] for t in listed]
    got = (await client.get(f"/admin/v1/tenants/{name}", headers=auth("admin:read"))).json()
    assert got["id"] == created["id"]

    resp = await client.patch(f"/admin/v1/tenants/{name}", headers=auth(sub="carol"),
                              json={"rpm": 120, "budget_usd": None, "budget_tokens": 1000, "cache_threshold": 0.95,
                                    "cache_enabled": False})
    assert resp.status_code == 200, resp.text
    updated = resp.json()
    assert (updated["rpm"], updated["tpm"], updated["budget_usd"], updated["budget_tokens"]) == (120, 5000, None, 1000)
    assert updated["cache_enabled"] is False and updated["cache_threshold"] == 0.95

    (entry,) = await _audit(app, "tenant.update", f"tenant:{name}")
    assert entry.actor == "carol"
    assert entry.before["rpm"] == 60 and entry.after["rpm"] == 120
    assert entry.before["budget_usd"] == 12.5 and entry.after["budget_usd"] is None
    (created_entry,) = await _audit(app, "tenant.create", f"tenant:{name}")
    assert created_entry.before is None and created_entry.after["name"] == name

    assert (await client.post(f"/admin/v1/tenants/{name}/disable", headers=auth())).json()["enabled"] is False
    assert len(await _audit(app, "tenant.disable", f"tenant:{name}")) == 1
    assert (await client.post(f"/admin/v1/tenants/{name}/enable", headers=auth())).json()["enabled"] is True
    assert len(await _audit(app, "tenant.enable", f"tenant:{name}")) == 1

    audit = (await client.get("/admin/v1/audit", params={"target": f"tenant:{name}"}, headers=auth())).json()
    assert [e["action"] for e in audit["data"]] == ["tenant.enable", "tenant.disable", "tenant.update",
                                                    "tenant.create"]


async def test_tenant_errors(client, auth):
    name = unique("dup")
    assert (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).status_code == 201
    resp = await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "conflict"
    resp = await client.get("/admin/v1/tenants/no-such-tenant", headers=auth())
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    for bad in ({"name": unique("x"), "rpm": -1}, {"name": unique("x"), "period": "week"},
                {"name": "bad name!"}, {"name": unique("x"), "colour": "red"}, {"rpm": 5}):
        resp = await client.post("/admin/v1/tenants", json=bad, headers=auth())
        assert resp.status_code == 400, (bad, resp.text)
        assert resp.json()["error"]["type"] == "invalid_request_error"
    resp = await client.patch(f"/admin/v1/tenants/{name}", json={"tpm": "lots"}, headers=auth())
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tpm"


async def test_budget_endpoints(client, app, auth):
    name = unique("budget")
    tid = (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).json()["id"]

    resp = await client.put(f"/admin/v1/tenants/{name}/budget", headers=auth(),
                            json={"budget_tokens": 50_000, "budget_usd": "3.25", "period": "day"})
    assert resp.status_code == 200, resp.text
    budget = resp.json()
    assert (budget["budget_tokens"], budget["budget_usd"], budget["period"]) == (50_000, 3.25, "day")
    assert budget["spent_tokens"] == 0 and budget["spent_usd"] == 0
    again = (await client.get(f"/admin/v1/tenants/{name}/budget", headers=auth("admin:read"))).json()
    assert again == budget
    resp = await client.put(f"/admin/v1/tenants/{name}/budget", headers=auth("admin:read"), json={})
    assert resp.status_code == 403

    now = datetime.now(UTC)
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add_all([
            usage_row(tenant_id=tid, key_id=None, model="m", when=now, prompt=300, cached=0,
                      completion=200, cost="0.5", latency=10.0),
            usage_row(tenant_id=tid, key_id=None, model="m", when=now, prompt=999, cached=0,
                      completion=1, cost="0", saved="0.3", latency=1.0, cache="hit"),  # no engine tokens
            usage_row(tenant_id=tid, key_id=None, model="m", when=now - timedelta(days=2),
                      prompt=50, cached=0, completion=50, cost="1", latency=10.0),  # an earlier day
        ])
        await s.commit()
    spent = (await client.get(f"/admin/v1/tenants/{name}/budget", headers=auth("admin:read"))).json()
    assert spent["spent_tokens"] == 500 and spent["spent_usd"] == 0.5


async def test_keys_create_list_revoke_rotate(client, app, auth, settings):
    tenant = unique("keys")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", headers=auth(sub="dave"),
                             json={"name": "ci", "allowed_models": ["smollm2-135m-instruct"], "rpm": 30})
    assert resp.status_code == 201, resp.text
    created = resp.json()
    key = created["key"]
    assert key.startswith("pg-") and created["prefix"] == key[:10]
    assert (created["name"], created["allowed_models"], created["rpm"], created["tenant"]) == (
        "ci", ["smollm2-135m-instruct"], 30, tenant)

    async with app.state.admin_context.database.sessionmaker() as s:
        row = await s.get(ApiKey, created["id"])
        assert row.key_hash == hash_key(key)  # only the hash is stored

    listed = (await client.get(f"/admin/v1/tenants/{tenant}/keys", headers=auth("admin:read"))).json()["data"]
    assert [k["id"] for k in listed] == [created["id"]]
    assert all("key" not in k and "key_hash" not in k for k in listed)
    by_prefix = (await client.get("/admin/v1/keys", params={"prefix": created["prefix"]},
                                  headers=auth("admin:read"))).json()["data"]
    assert [k["id"] for k in by_prefix] == [created["id"]]
    assert (await client.get(f"/admin/v1/keys/{created['prefix']}", headers=auth())).json()["id"] == created["id"]

    redis = Redis.from_url(settings.redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(invalidation_channel(settings.redis_prefix))
    await pubsub.get_message(timeout=1.0)  # subscribe confirmation

    resp = await client.post(f"/admin/v1/keys/{created['id']}/rotate", headers=auth(sub="dave"))
    assert resp.status_code == 201, resp.text
    rotated = resp.json()
    assert rotated["key"] != key and rotated["replaces"]["revoked"] is True
    assert (rotated["name"], rotated["allowed_models"], rotated["rpm"]) == ("ci", ["smollm2-135m-instruct"], 30)
    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2.0)
    assert msg is not None and msg["data"] == f"key:{hash_key(key)}".encode()

    resp = await client.post(f"/admin/v1/keys/{rotated['id']}/revoke", headers=auth(sub="dave"))
    assert resp.status_code == 200 and resp.json()["revoked"] is True and resp.json()["revoked_at"]
    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2.0)
    assert msg is not None and msg["data"] == f"key:{hash_key(rotated['key'])}".encode()

    resp = await client.post(f"/admin/v1/keys/{created['id']}/rotate", headers=auth())
    assert resp.status_code == 409  # already revoked
    active = (await client.get("/admin/v1/keys", params={"tenant": tenant, "include_revoked": "false"},
                               headers=auth())).json()["data"]
    assert active == []
    assert (await client.post("/admin/v1/keys/999999/revoke", headers=auth())).status_code == 404

    (revoke_entry,) = await _audit(app, "key.revoke", f"key:{rotated['prefix']}")
    assert revoke_entry.actor == "dave"
    assert revoke_entry.before["revoked"] is False and revoke_entry.after["revoked"] is True
    (rotate_entry,) = await _audit(app, "key.rotate", f"key:{created['prefix']}")
    assert rotate_entry.after["replacement"]["prefix"] == rotated["prefix"]
    await pubsub.aclose()
    await redis.aclose()


async def test_disable_publishes_tenant_invalidation(client, app, auth, settings):
    tenant = unique("inval")
    tid = (await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())).json()["id"]
    redis = Redis.from_url(settings.redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(invalidation_channel(settings.redis_prefix))
    await pubsub.get_message(timeout=1.0)
    await client.post(f"/admin/v1/tenants/{tenant}/disable", headers=auth())
    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2.0)
    assert msg is not None and msg["data"] == f"tenant:{tid}".encode()
    async with app.state.admin_context.database.sessionmaker() as s:
        assert (await s.get(Tenant, tid)).enabled is False
    await pubsub.aclose()
    await redis.aclose()


async def test_prices(client, app, auth):
    model = unique("org/model")
    resp = await client.put(f"/admin/v1/prices/{model}", headers=auth(sub="erin"),
                            json={"prompt_usd_per_1m": "0.15", "completion_usd_per_1m": 0.6})
    assert resp.status_code == 200, resp.text
    assert resp.json()["prompt_usd_per_1m"] == 0.15 and resp.json()["completion_usd_per_1m"] == 0.6
    await client.put(f"/admin/v1/prices/{model}", headers=auth(sub="erin"),
                     json={"prompt_usd_per_1m": "0.2", "completion_usd_per_1m": "0.8"})
    prices = (await client.get("/admin/v1/prices", headers=auth("admin:read"))).json()["data"]
    assert {"model": model, "prompt_usd_per_1m": 0.2, "completion_usd_per_1m": 0.8} in [
        {k: p[k] for k in ("model", "prompt_usd_per_1m", "completion_usd_per_1m")} for p in prices]
    entries = await _audit(app, "price.set", f"model:{model}")
    assert [e.before for e in entries][0] is None
    assert entries[1].before["prompt_usd_per_1m"] == 0.15 and entries[1].after["prompt_usd_per_1m"] == 0.2
    resp = await client.put(f"/admin/v1/prices/{model}", headers=auth(),
                            json={"prompt_usd_per_1m": -1, "completion_usd_per_1m": 0})
    assert resp.status_code == 400


@pytest.mark.parametrize("method,path", [
    ("get", "/admin/v1/tenants"), ("post", "/admin/v1/tenants"), ("get", "/admin/v1/tenants/x"),
    ("patch", "/admin/v1/tenants/x"), ("post", "/admin/v1/tenants/x/disable"),
    ("post", "/admin/v1/tenants/x/enable"), ("get", "/admin/v1/tenants/x/budget"),
    ("put", "/admin/v1/tenants/x/budget"), ("get", "/admin/v1/tenants/x/keys"),
    ("post", "/admin/v1/tenants/x/keys"), ("get", "/admin/v1/keys"), ("get", "/admin/v1/keys/1"),
    ("post", "/admin/v1/keys/1/revoke"), ("post", "/admin/v1/keys/1/rotate"), ("get", "/admin/v1/prices"),
    ("put", "/admin/v1/prices/m"), ("get", "/admin/v1/tenants/x/report"), ("get", "/admin/v1/summary"),
    ("get", "/admin/v1/audit"), ("get", "/admin/v1/whoami"),
])
async def test_every_endpoint_refuses_without_token(client, method, path):
    resp = await client.request(method.upper(), path, json={})
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"]["code"] == "invalid_token"


@pytest.mark.parametrize("method,path", [
    ("post", "/admin/v1/tenants"), ("patch", "/admin/v1/tenants/x"), ("post", "/admin/v1/tenants/x/disable"),
    ("post", "/admin/v1/tenants/x/enable"), ("put", "/admin/v1/tenants/x/budget"),
    ("post", "/admin/v1/tenants/x/keys"), ("post", "/admin/v1/keys/1/revoke"),
    ("post", "/admin/v1/keys/1/rotate"), ("put", "/admin/v1/prices/m"),
])
async def test_every_write_endpoint_needs_write_scope(client, auth, method, path):
    resp = await client.request(method.upper(), path, json={}, headers=auth("admin:read"))
    assert resp.status_code == 403, resp.text
    assert resp.json()["error"]["code"] == "insufficient_scope"


async def test_concurrent_key_creation_is_consistent(client, auth):
    tenant = unique("conc")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    replies = await asyncio.gather(*[client.post(f"/admin/v1/tenants/{tenant}/keys", json={}, headers=auth())
                                     for _ in range(5)])
    assert all(r.status_code == 201 for r in replies)
    assert len({r.json()["key"] for r in replies}) == 5
    listed = (await client.get(f"/admin/v1/tenants/{tenant}/keys", headers=auth())).json()["data"]
    assert len(listed) == 5


async def test_write_survives_unreachable_redis(settings, auth):
    """The change is committed even when the invalidation cannot be pushed (Redis down)."""
    import httpx
    from fastapi import FastAPI

    import admin

    router = admin.build_admin_router(settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"}))
    app = FastAPI()
    app.include_router(router)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            tenant = unique("noredis")
            assert (await c.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())).status_code == 201
            key = (await c.post(f"/admin/v1/tenants/{tenant}/keys", json={}, headers=auth())).json()
            resp = await c.post(f"/admin/v1/keys/{key['id']}/revoke", headers=auth())
            assert resp.status_code == 200 and resp.json()["revoked"] is True
            resp = await c.post(f"/admin/v1/tenants/{tenant}/disable", headers=auth())
            assert resp.status_code == 200 and resp.json()["enabled"] is False
    finally:
        await router.admin_context.aclose()
