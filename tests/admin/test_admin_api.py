"""Admin API resources against real SQLite/PostgreSQL and Redis: tenants, budgets, keys, prices,
the audit trail and Redis invalidations."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

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

    # the newest tenant has the highest id: the page right after the id before it starts with it
    page = {"limit": 1} | ({"after": created["id"] - 1} if created["id"] > 1 else {})  # after >= 1
    listed = (await client.get("/admin/v1/tenants", params=page, headers=auth("admin:read"))).json()["data"]
    assert [t["name"] for t in listed] == [name]
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
    assert entry.before["budget_usd"] == "12.50000000" and entry.after["budget_usd"] is None  # exact, as stored
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
    # the same name in other case is the same name (found by QA: "acme" and "ACME" were two tenants)
    resp = await client.post("/admin/v1/tenants", json={"name": name.upper()}, headers=auth())
    assert resp.status_code == 409 and f"as '{name}' (names are compared without case)" in resp.json()["error"]["message"]
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
    await pubsub.subscribe(invalidation_channel(settings.redis_prefix, redis))
    await pubsub.get_message(timeout=1.0)  # subscribe confirmation

    resp = await client.post(f"/admin/v1/keys/{created['id']}/rotate", headers=auth(sub="dave"))
    assert resp.status_code == 201, resp.text
    rotated = resp.json()
    assert rotated["key"] != key and rotated["replaces"]["revoked"] is True
    assert (rotated["name"], rotated["allowed_models"], rotated["rpm"]) == ("ci", ["smollm2-135m-instruct"], 30)
    assert rotated["tenant"] == rotated["replaces"]["tenant"] == tenant  # as create and get name it
    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2.0)
    assert msg is not None and msg["data"] == f"key:{hash_key(key)}".encode()

    resp = await client.post(f"/admin/v1/keys/{rotated['id']}/revoke", headers=auth(sub="dave"))
    assert resp.status_code == 200 and resp.json()["revoked"] is True and resp.json()["revoked_at"]
    assert resp.json()["tenant"] == tenant
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
    assert revoke_entry.before["tenant"] == revoke_entry.after["tenant"] == tenant
    (rotate_entry,) = await _audit(app, "key.rotate", f"key:{created['prefix']}")
    assert rotate_entry.after["replacement"]["prefix"] == rotated["prefix"]
    (create_entry,) = await _audit(app, "key.create", f"key:{rotated['prefix']}")  # its history starts there
    assert create_entry.after["replaces"] == created["prefix"] and create_entry.actor == rotate_entry.actor
    await pubsub.aclose()
    await redis.aclose()


async def test_disable_publishes_tenant_invalidation(client, app, auth, settings):
    tenant = unique("inval")
    tid = (await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())).json()["id"]
    redis = Redis.from_url(settings.redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(invalidation_channel(settings.redis_prefix, redis))
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
    # stored as exact strings (the JSON column has no decimal type); the audit API gives numbers back
    assert entries[1].before["prompt_usd_per_1m"] == "0.15000000" and entries[1].after["prompt_usd_per_1m"] == "0.20000000"
    audit = (await client.get("/admin/v1/audit", params={"target": f"model:{model}"}, headers=auth())).json()
    assert audit["data"][0]["after"]["prompt_usd_per_1m"] == 0.2
    resp = await client.put(f"/admin/v1/prices/{model}", headers=auth(),
                            json={"prompt_usd_per_1m": -1, "completion_usd_per_1m": 0})
    assert resp.status_code == 400
    assert entries[1].after["cached_prompt_usd_per_1m"] is None  # not set: billed as other prompt tokens


async def test_a_price_can_be_deleted(client, app, auth):
    """Found by QA: a mistyped model's price could not be removed (405)."""
    model = unique("typo/model")
    await client.put(f"/admin/v1/prices/{model}", headers=auth(), json={"prompt_usd_per_1m": 1, "completion_usd_per_1m": 2})
    assert (await client.delete(f"/admin/v1/prices/{model}", headers=auth("admin:read"))).status_code == 403
    assert (await client.request("DELETE", f"/admin/v1/prices/{model}", headers=auth(),
                                 json={"force": True})).status_code == 400  # it takes no body
    resp = await client.delete(f"/admin/v1/prices/{model}", headers=auth(sub="erin"))
    assert resp.status_code == 200 and resp.json()["deleted"] is True and resp.json()["model"] == model, resp.text
    prices = (await client.get("/admin/v1/prices", headers=auth())).json()["data"]
    assert model not in [p["model"] for p in prices]
    (entry,) = await _audit(app, "price.delete", f"model:{model}")
    assert entry.actor == "erin" and entry.before["prompt_usd_per_1m"] == "1.00000000"
    resp = await client.delete(f"/admin/v1/prices/{model}", headers=auth())
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


async def test_cached_prompt_price(client, app, auth):
    model = unique("org/model")
    body = {"prompt_usd_per_1m": "1.25", "completion_usd_per_1m": 10, "cached_prompt_usd_per_1m": "0.125"}
    resp = await client.put(f"/admin/v1/prices/{model}", headers=auth(), json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["cached_prompt_usd_per_1m"] == 0.125
    prices = (await client.get("/admin/v1/prices", headers=auth("admin:read"))).json()["data"]
    assert [p["cached_prompt_usd_per_1m"] for p in prices if p["model"] == model] == [0.125]
    again = await client.put(f"/admin/v1/prices/{model}", headers=auth(), json=body)  # the price it has
    assert again.status_code == 200 and len(await _audit(app, "price.set", f"model:{model}")) == 1
    # PUT sets the whole price: left out, the cached price is unset again
    resp = await client.put(f"/admin/v1/prices/{model}", headers=auth(),
                            json={"prompt_usd_per_1m": "1.25", "completion_usd_per_1m": 10})
    assert resp.json()["cached_prompt_usd_per_1m"] is None
    entries = await _audit(app, "price.set", f"model:{model}")
    assert entries[-1].before["cached_prompt_usd_per_1m"] == "0.12500000" and entries[-1].after["cached_prompt_usd_per_1m"] is None
    for bad in (-1, "x", 1e30):
        resp = await client.put(f"/admin/v1/prices/{model}", headers=auth(),
                                json={**body, "cached_prompt_usd_per_1m": bad})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "cached_prompt_usd_per_1m", resp.text


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


@pytest.mark.parametrize("path,body,param", [
    ("/admin/v1/tenants", {"rpm": 2**31}, "rpm"),  # past the INTEGER column
    ("/admin/v1/tenants", {"budget_tokens": 2**63}, "budget_tokens"),
    ("/admin/v1/tenants", {"budget_usd": "1e20"}, "budget_usd"),  # past NUMERIC(18, 8)
    ("/admin/v1/tenants", {"budget_usd": "NaN"}, "budget_usd"),
    ("/admin/v1/tenants", {"cache_ttl_s": 0}, "cache_ttl_s"),
    ("/admin/v1/tenants", {"cache_threshold": 1.5}, "cache_threshold"),
    ("/admin/v1/prices/m", {"prompt_usd_per_1m": "0.000000001", "completion_usd_per_1m": 1}, "prompt_usd_per_1m"),
    ("/admin/v1/prices/m", {"prompt_usd_per_1m": 1e30, "completion_usd_per_1m": 1}, "prompt_usd_per_1m"),
    ("/admin/v1/prices/" + "m" * 129, {"prompt_usd_per_1m": 1, "completion_usd_per_1m": 1}, "model"),
    ("/admin/v1/tenants/{t}/keys", {"rpm": 2**31}, "rpm"),
    ("/admin/v1/tenants/{t}/keys", {"allowed_models": [""]}, "allowed_models"),
    ("/admin/v1/tenants/{t}/keys", {"allowed_models": []}, "allowed_models"),  # not "all models": null is
    ("/admin/v1/tenants/{t}/keys", {"allowed_models": ["m", " "]}, "allowed_models"),
    ("/admin/v1/tenants/{t}/keys", {"allowed_models": "all"}, "allowed_models"),
])
async def test_out_of_range_values_are_400_on_both_databases(client, auth, path, body, param):
    """Values the database columns cannot hold are refused up front (PostgreSQL would fail the
    INSERT with a 500; SQLite would silently store them)."""
    tenant = unique("bounds")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    path = path.replace("{t}", tenant)
    if path == "/admin/v1/tenants":
        body = {"name": unique("b"), **body}
    method = "PUT" if "/prices/" in path else "POST"
    resp = await client.request(method, path, json=body, headers=auth())
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == {"message": resp.json()["error"]["message"], "type": "invalid_request_error",
                                    "param": param, "code": resp.json()["error"]["code"]}
    assert resp.json()["error"]["code"] in ("invalid_value", "invalid_type")  # (found by QA: it was null)
    assert param in resp.json()["error"]["message"]


async def test_odd_requests_get_clear_errors(client, auth):
    resp = await client.post("/admin/v1/tenants", content=b"not json",
                             headers={**auth(), "content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["message"] == "The request body is not valid JSON."
    assert resp.json()["error"]["code"] == "invalid_json"
    resp = await client.post("/admin/v1/tenants", content=b"[1]", headers={**auth(), "content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_type", resp.text
    deep = b'{"name": "deep", "allowed_models": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # (QA: code null)
    resp = await client.post("/admin/v1/tenants", content=deep, headers={**auth(), "content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json", resp.text
    resp = await client.post("/admin/v1/tenants", json={"rpm": 5}, headers=auth())
    assert resp.json()["error"]["code"] == "missing_required_parameter" and resp.json()["error"]["param"] == "name"
    resp = await client.post("/admin/v1/tenants", json={"name": "bad name!"}, headers=auth())
    assert resp.status_code == 400 and "letters, digits" in resp.json()["error"]["message"]
    assert resp.json()["error"]["code"] == "invalid_value"
    assert not resp.json()["error"]["message"].startswith("name: Value error")
    for ref in ("99999999999999999999", "0", "pg-nothing"):
        resp = await client.get(f"/admin/v1/keys/{ref}", headers=auth())
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", resp.text
        assert (await client.post(f"/admin/v1/keys/{ref}/revoke", headers=auth())).status_code == 404
    tenant = unique("range")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    for params in ({"until": "0001-01-02"}, {"since": "0001-01-01", "until": "9999-12-31"}):
        resp = await client.get(f"/admin/v1/tenants/{tenant}/report", params=params, headers=auth())
        assert resp.status_code == 200, resp.text
        assert resp.json()["total"]["requests"] == 0
    resp = await client.get(f"/admin/v1/tenants/{tenant}/report", params={"since": "2026-13-45"}, headers=auth())
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "since"


async def test_revoking_twice_changes_nothing_the_second_time(client, app, auth):
    tenant = unique("twice")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    key = (await client.post(f"/admin/v1/tenants/{tenant}/keys", json={}, headers=auth())).json()
    first = await client.post(f"/admin/v1/keys/{key['id']}/revoke", headers=auth())
    second = await client.post(f"/admin/v1/keys/{key['prefix']}/revoke", headers=auth())
    assert first.status_code == second.status_code == 200
    assert second.json()["revoked_at"] == first.json()["revoked_at"]
    assert len(await _audit(app, "key.revoke", f"key:{key['prefix']}")) == 1


async def test_unreachable_database_is_503_in_the_error_shape(settings, auth):
    import httpx
    from fastapi import FastAPI

    import admin

    router = admin.build_admin_router(settings.model_copy(
        update={"database_url": "postgresql+asyncpg://postgres@127.0.0.1:1/nothing"}))
    app = FastAPI()
    app.include_router(router)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            resp = await c.get("/admin/v1/tenants", headers=auth())
    finally:
        await router.admin_context.aclose()
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "database_unavailable"
    assert "Traceback" not in resp.text


@pytest.mark.parametrize("ref", ["%C2%B2", "%D9%A3"])  # '²', '٣': str.isdigit() says yes, int() says no
async def test_key_refs_of_non_ascii_digits_are_unknown_keys(client, auth, ref):
    for method, path in (("GET", f"/admin/v1/keys/{ref}"), ("POST", f"/admin/v1/keys/{ref}/revoke"),
                         ("POST", f"/admin/v1/keys/{ref}/rotate")):
        resp = await client.request(method, path, headers=auth())
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"]["code"] == "not_found"


async def test_only_null_or_absent_allowed_models_means_all_models(client, auth):
    tenant = unique("allmodels")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    for body in ({}, {"allowed_models": None}):
        resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", json=body, headers=auth())
        assert resp.status_code == 201 and resp.json()["allowed_models"] is None, resp.text
    for models in ([], [""], ["m", ""]):
        resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", json={"allowed_models": models}, headers=auth())
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "allowed_models" and "all models" in resp.json()["error"]["message"]
    listed = (await client.get(f"/admin/v1/tenants/{tenant}/keys", headers=auth())).json()["data"]
    assert len(listed) == 2  # the refused requests minted nothing


async def test_tenant_names_must_match_the_whole_pattern(client, app, auth):
    """``$`` matched before a trailing newline, and the name was then stripped past the duplicate
    check: "acme\n" next to "acme" was a 400 without a code, "bad\n" was stored as "bad"."""
    name = unique("whole")
    assert (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).status_code == 201
    fresh = unique("fresh")
    for bad in (f"{name}\n", f"{fresh}\n", f" {fresh}", f"{fresh}\t"):
        resp = await client.post("/admin/v1/tenants", json={"name": bad}, headers=auth())
        assert resp.status_code == 400, (bad, resp.text)
        assert resp.json()["error"]["param"] == "name" and "letters, digits" in resp.json()["error"]["message"]
    async with app.state.admin_context.database.sessionmaker() as s:
        assert await s.scalar(select(Tenant).where(Tenant.name == fresh)) is None


async def test_the_csv_sum_line_name_is_reserved(client, auth):
    """Found by QA: a tenant named ``TOTAL`` gave the summary's CSV two ``TOTAL`` lines, and a
    spreadsheet that left the sum line out left the tenant out too."""
    for name in ("TOTAL", "total", "Total"):
        resp = await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "name" and "reserved" in resp.json()["error"]["message"]
    assert (await client.post("/admin/v1/tenants", json={"name": unique("TOTALS")}, headers=auth())).status_code == 201


async def test_money_is_exact_in_replies_and_the_audit_log(client, app, auth, settings):
    """A JSON number with 18 digits is read as sent and written back digit for digit (a float
    held 1234567890.1234567); SQLite, which keeps NUMERIC as a double, refuses it instead of
    rounding it. Prices stop at 1000000 per 1M (14 digits, which a double gives back); a budget
    may have 18."""
    model = unique("exact")
    headers = {**auth(), "content-type": "application/json"}
    want = Decimal("999999.12345678")
    raw = b'{"prompt_usd_per_1m": 999999.12345678, "completion_usd_per_1m": 0.00000001}'
    resp = await client.put(f"/admin/v1/prices/{model}", content=raw, headers=headers)
    assert resp.status_code == 200, resp.text
    assert f'"prompt_usd_per_1m":{want},"completion_usd_per_1m":0.00000001' in resp.text  # JSON numbers
    listed = json.loads((await client.get("/admin/v1/prices", headers=auth())).text, parse_float=Decimal)["data"]
    assert [p["prompt_usd_per_1m"] for p in listed if p["model"] == model] == [want]
    audit = json.loads((await client.get("/admin/v1/audit", params={"target": f"model:{model}"},
                                         headers=auth())).text, parse_float=Decimal)["data"]
    assert audit[0]["after"]["prompt_usd_per_1m"] == want
    (entry,) = await _audit(app, "price.set", f"model:{model}")
    assert entry.after["prompt_usd_per_1m"] == str(want)  # stored as the exact string

    name = unique("exact")
    assert (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).status_code == 201
    resp = await client.patch(f"/admin/v1/tenants/{name}", content=b'{"budget_usd": 1234567890.12345678}',
                              headers=headers)
    if settings.database_url.startswith("sqlite"):
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "budget_usd" and "SQLite" in resp.json()["error"]["message"]
    else:
        assert resp.status_code == 200 and '"budget_usd":1234567890.12345678' in resp.text, resp.text

    resp = await client.post("/admin/v1/tenants", json={"name": unique("m"), "budget_usd": "12.5"}, headers=auth())
    assert '"budget_usd":12.50000000' in resp.text  # money always shows its 8 decimals


@pytest.mark.parametrize("method,path,content,ctype", [
    ("POST", "/admin/v1/tenants", b"{bad", "application/json"),
    ("PUT", "/admin/v1/prices/x", b"nope", "application/json"),
    ("PUT", "/admin/v1/prices/x", b"nope", "application/x-www-form-urlencoded"),  # curl -d nope
    ("PATCH", "/admin/v1/tenants/x", b"[1,", "application/json"),
    ("POST", "/admin/v1/tenants/x/keys", b'"a string"', "application/json"),
    ("GET", "/admin/v1/audit?limit=0", b"", None),  # a bad query parameter
])
async def test_authentication_comes_before_reading_the_request(client, auth, method, path, content, ctype):
    """FastAPI reads the body before any dependency runs; the token is still checked first."""
    headers = {"content-type": ctype} if ctype else {}
    resp = await client.request(method, path, content=content, headers=headers)
    assert resp.status_code == 401, resp.text
    assert resp.json()["error"]["code"] == "invalid_token" and resp.headers["www-authenticate"].startswith("Bearer")
    resp = await client.request(method, path, content=content, headers={**headers, "authorization": "Bearer x.y.z"})
    assert resp.status_code == 401, resp.text
    if method != "GET":
        resp = await client.request(method, path, content=content, headers={**headers, **auth("admin:read")})
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "insufficient_scope", resp.text
    resp = await client.request(method, path, content=content, headers={**headers, **auth()})
    assert resp.status_code == 400, resp.text  # an allowed caller learns what is wrong with the request


async def test_every_timestamp_is_utc_to_the_second(client, auth):
    """Times set by the database's clock (created_at, updated_at: whole seconds on SQLite) and by
    pagegate (revoked_at, deleted_at: microseconds) are shown alike, in views and audit snapshots."""
    when = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")
    name = unique("times")
    await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
    key = (await client.post(f"/admin/v1/tenants/{name}/keys", json={}, headers=auth())).json()
    revoked = (await client.post(f"/admin/v1/keys/{key['id']}/revoke", headers=auth())).json()
    model = unique("m")
    price = (await client.put(f"/admin/v1/prices/{model}", json={"prompt_usd_per_1m": 1, "completion_usd_per_1m": 2},
                              headers=auth())).json()
    deleted = (await client.delete(f"/admin/v1/tenants/{name}", headers=auth())).json()
    budget = (await client.get(f"/admin/v1/tenants/{name}/budget", headers=auth())).json()
    audit = (await client.get("/admin/v1/audit", params={"target": f"tenant:{name}"}, headers=auth())).json()["data"]
    shown = [key["created_at"], revoked["created_at"], revoked["revoked_at"], price["updated_at"],
             deleted["created_at"], deleted["updated_at"], deleted["deleted_at"], budget["deleted_at"],
             budget["period_start"], *(e["created_at"] for e in audit), audit[0]["after"]["deleted_at"]]
    assert all(isinstance(t, str) and when.fullmatch(t) for t in shown), shown


async def test_a_nul_in_the_url_is_400_on_both_databases(client, auth):
    """PostgreSQL refuses a NUL in any text value: a path or filter holding one was a 500."""
    tenant = unique("nul")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    for method, path, params in (("GET", "/admin/v1/tenants/%00", None), ("GET", "/admin/v1/keys/pg-%00abc", None),
                                 ("GET", "/admin/v1/keys", {"prefix": "\x00"}), ("GET", "/admin/v1/keys", {"tenant": "\x00"}),
                                 ("GET", "/admin/v1/audit", {"target": "\x00"}), ("GET", "/admin/v1/audit", {"action": "a\x00"}),
                                 ("GET", f"/admin/v1/tenants/{tenant}%00/report", None),
                                 ("GET", "/admin/v1/tenants/%00/budget", None)):
        resp = await client.request(method, path, params=params, headers=auth())
        assert resp.status_code == 400 and "NUL" in resp.json()["error"]["message"], (path, params, resp.text)
    resp = await client.put("/admin/v1/prices/a%00b", json={"prompt_usd_per_1m": 1, "completion_usd_per_1m": 1},
                            headers=auth())
    assert resp.status_code == 400, resp.text
    assert (await client.get("/admin/v1/tenants/%00")).status_code == 401  # the token still comes first


async def test_model_names_are_printable(client, auth):
    tenant = unique("models")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    for name in ("a\x00b", "\u2028x", "a\nb"):
        resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", json={"allowed_models": [name]}, headers=auth())
        assert resp.status_code == 400 and resp.json()["error"]["param"].startswith("allowed_models"), resp.text
    assert (await client.get(f"/admin/v1/tenants/{tenant}/keys", headers=auth())).json()["data"] == []


async def test_a_body_without_a_json_content_type_is_named_so(client, auth):
    for ctype in ("text/plain", "application/x-www-form-urlencoded"):
        resp = await client.post("/admin/v1/tenants", content=json.dumps({"name": unique("ct")}),
                                 headers={**auth(), "content-type": ctype})
        assert resp.status_code == 400, resp.text
        assert "content-type: application/json" in resp.json()["error"]["message"], resp.text
    # no content type at all: JSON, as on /v1 (found by QA: requests.post(data=json.dumps(...)) was refused)
    name = unique("noct")
    resp = await client.post("/admin/v1/tenants", content=json.dumps({"name": name}), headers=auth())
    assert resp.status_code == 201 and resp.json()["name"] == name, resp.text


async def test_a_json_body_that_is_not_an_object_is_named_so(client, auth):
    """Found by QA: a JSON string body sent as application/json was told to send that content type."""
    for body, kind in (('"x"', "a string"), ("[1]", "an array"), ("5", "a number"), ("true", "a boolean")):
        resp = await client.post("/admin/v1/tenants", content=body,
                                 headers={**auth(), "content-type": "application/json"})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["message"] == f"The request body must be a JSON object, not {kind}.", resp.text


async def test_a_key_is_created_without_a_body(client, auth):
    """Every key field is optional: no body is an empty one (found by QA: it was 'Field required')."""
    tenant = unique("nobody")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", headers=auth())
    assert resp.status_code == 201 and resp.json()["key"].startswith("pg-"), resp.text


async def test_nan_and_infinity_are_not_finite_numbers(client, auth):
    for literal in ("NaN", "Infinity", "-Infinity"):
        body = f'{{"name": "{unique("nan")}", "cache_threshold": {literal}}}'
        resp = await client.post("/admin/v1/tenants", content=body,
                                 headers={**auth(), "content-type": "application/json"})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "cache_threshold", resp.text
        assert "finite number" in resp.json()["error"]["message"], resp.text


async def test_price_model_names_are_printable_and_trimmed(client, auth):
    """Found by QA: a price's model name took an ESC sequence and a CR (which then reached the
    terminal through `prices list`), a right-to-left override, a leading space."""
    body = {"prompt_usd_per_1m": 1, "completion_usd_per_1m": 1}
    for path in ("evil%1B%5B31mRED%0Dx", "m%07x", "m%C2%85x", "m%E2%80%AEx", "m%E2%80%8Bx", "%20m", "m%20"):
        resp = await client.put(f"/admin/v1/prices/{path}", json=body, headers=auth())
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "model", (path, resp.text)
    tenant = unique("rlo")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", json={"allowed_models": ["m\u202ex"]}, headers=auth())
    assert resp.status_code == 400, resp.text


async def test_a_number_of_thousands_of_digits_is_named_on_the_admin_api(client, auth):
    tenant = unique("digits")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    resp = await client.patch(f"/admin/v1/tenants/{tenant}", content='{"rpm": ' + "9" * 5000 + "}",
                              headers={**auth(), "content-type": "application/json"})
    assert resp.status_code == 400 and "digits" in resp.json()["error"]["message"], resp.text


async def test_budget_spend_counts_only_the_current_period(client, app, auth):
    """Found by QA: the budget view counted every row since the period's start, so a row dated after
    the period (clock skew, a backfill) was spent this period, while the gateway's quota counts
    ``[start, end)``. Both now count ``[start, end)``."""
    name = unique("period")
    tid = (await client.post("/admin/v1/tenants", json={"name": name, "period": "month"}, headers=auth())).json()["id"]
    now = datetime.now(UTC)
    next_month = (now.replace(day=1, hour=0, minute=0, second=0, microsecond=0) + timedelta(days=32)).replace(day=1)
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add_all([
            usage_row(tenant_id=tid, key_id=None, model="m", when=now, prompt=10, cached=0, completion=5,
                      cost="0.5", latency=1.0),
            usage_row(tenant_id=tid, key_id=None, model="m", when=next_month, prompt=1000, cached=0,
                      completion=1000, cost="7", latency=1.0),  # the next period's first instant
        ])
        await s.commit()
    spent = (await client.get(f"/admin/v1/tenants/{name}/budget", headers=auth("admin:read"))).json()
    assert (spent["spent_tokens"], spent["spent_usd"]) == (15, 0.5)


async def test_budget_spend_is_summed_exactly(client, app, auth):
    """Found by QA: on SQLite the budget's spend was a float sum (2482.56999999 for 2482.57 over
    630,000 rows); it is now the exact sum of the rows' 1e-8 USD units, as on PostgreSQL."""
    cost, rows = "1234.56789012", 500  # as floats one after the other: 617283.94505999
    name = unique("exact-spend")
    tid = (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).json()["id"]
    period_start = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add_all([usage_row(tenant_id=tid, key_id=None, model="m", when=period_start + timedelta(seconds=i),
                             prompt=1, cached=0, completion=1, cost=cost, latency=1.0) for i in range(rows)])
        await s.commit()
    resp = await client.get(f"/admin/v1/tenants/{name}/budget", headers=auth("admin:read"))
    assert json.loads(resp.text, parse_float=Decimal)["spent_usd"] == Decimal(cost) * rows, resp.text


async def test_a_price_set_on_an_embedding_alias_is_kept_under_its_served_id(client, auth):
    """Found by QA: a price PUT on an alias of the embedding model was taken and never applied
    (usage rows name the served id)."""
    for alias in ("all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        resp = await client.put(f"/admin/v1/prices/{alias}", json={"prompt_usd_per_1m": 0.02, "completion_usd_per_1m": 0},
                                headers=auth())
        assert resp.status_code == 200 and resp.json()["model"] == "all-MiniLM-L6-v2", resp.text


async def test_changes_that_take_no_body_refuse_one(client, app, auth):
    """Found by QA: ``DELETE /tenants/t {"force": true}``, a rotate with ``{"x": 1}`` and a revoke with
    ``garbage`` acted anyway, so a script that thought it passed an option got a silent change.
    A body is refused (400, nothing changed); none, ``{}`` and ``null`` are what "no body" looks like."""
    tenant = unique("bare")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    key = (await client.post(f"/admin/v1/tenants/{tenant}/keys", headers=auth())).json()
    for method, path in (("POST", f"/admin/v1/keys/{key['id']}/rotate"), ("POST", f"/admin/v1/keys/{key['id']}/revoke"),
                         ("POST", f"/admin/v1/tenants/{tenant}/disable"), ("DELETE", f"/admin/v1/tenants/{tenant}")):
        for body in (b'{"force": true}', b"garbage", b"[]"):
            resp = await client.request(method, path, content=body, headers=auth() | {"content-type": "application/json"})
            assert resp.status_code == 400, (method, path, body, resp.text)
            err = resp.json()["error"]
            assert err["type"] == "invalid_request_error" and "takes no request body" in err["message"], err
        # a read-only token learns about its scope first
        resp = await client.request(method, path, content=b"garbage", headers=auth("admin:read"))
        assert resp.status_code == 403, resp.text
    got = (await client.get(f"/admin/v1/keys/{key['id']}", headers=auth())).json()
    assert got["revoked"] is False  # nothing changed
    assert (await client.get(f"/admin/v1/tenants/{tenant}", headers=auth())).json()["enabled"] is True
    for body in (b"", b"{}", b" null\n"):
        resp = await client.post(f"/admin/v1/tenants/{tenant}/disable", content=body, headers=auth())
        assert resp.status_code == 200, (body, resp.text)
    resp = await client.post(f"/admin/v1/tenants/{tenant}/enable", headers=auth())
    assert resp.status_code == 200 and resp.json()["enabled"] is True


@pytest.mark.parametrize("amount", ["12.000000000000000000001", "1e400", "12345678901", "0.000000001"])
async def test_money_out_of_range_names_the_rule(client, auth, amount):
    """Found by QA: the 400 said "no more than 18 digits in total" where the rule is 10 and 8."""
    name = unique("money")
    assert (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).status_code == 201
    resp = await client.patch(f"/admin/v1/tenants/{name}", content=f'{{"budget_usd": {amount}}}',
                              headers={**auth(), "content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == "budget_usd" and "at most 10 digits before the point and 8 after it" in err["message"], err
    resp = await client.put("/admin/v1/prices/m-money", headers={**auth(), "content-type": "application/json"},
                            content=f'{{"prompt_usd_per_1m": {amount}, "completion_usd_per_1m": 1}}')
    assert resp.status_code == 400 and "at most 10 digits before the point and 8 after it" in resp.json()["error"]["message"]


@pytest.mark.parametrize("field", ["prompt_usd_per_1m", "completion_usd_per_1m", "cached_prompt_usd_per_1m"])
async def test_a_price_over_a_dollar_a_token_is_refused(client, auth, field):
    """Found by QA: a price of 9999999999.99999999 per 1M was taken, and a reservation at it passed
    what Redis's script could count (a 503, and a counter charged with no entry to give back)."""
    body = {"prompt_usd_per_1m": 1, "completion_usd_per_1m": 1, field: "1000000.00000001"}
    resp = await client.put("/admin/v1/prices/m-dear", headers=auth(), json=body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == field and "at most 1000000" in err["message"], err
    body[field] = 1_000_000  # the bound itself passes
    assert (await client.put("/admin/v1/prices/m-dear", headers=auth(), json=body)).status_code == 200


async def test_an_unknown_query_parameter_is_refused_after_the_token(client, auth):
    """Found by QA: ``?groupby=model`` (for ``group_by``) answered the report grouped by day, and
    ``/summary?from=…&to=…`` the last 30 days, each with 200. A parameter the endpoint does not take
    is a 400 naming it (after the token check: no token is still a 401); known ones still pass."""
    tenant = unique("query")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    for path, params in ((f"/admin/v1/tenants/{tenant}/report", {"groupby": "model"}),
                         ("/admin/v1/summary", {"from": "2026-01-01", "to": "2026-01-02"}),
                         ("/admin/v1/tenants", {"limit": "5", "offset": "5"}),
                         (f"/admin/v1/tenants/{tenant}", {"verbose": "1"})):
        resp = await client.get(path, params=params, headers=auth())
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["param"] in params and err["param"] != "limit" and "not a query parameter" in err["message"]
        assert (await client.get(path, params=params)).status_code == 401
    resp = await client.get(f"/admin/v1/tenants/{tenant}/report", headers=auth(),
                            params={"group_by": "model", "since": "2026-01-01", "until": "2026-01-02",
                                    "format": "csv"})
    assert resp.status_code == 200 and resp.text.startswith("model,"), resp.text
    assert (await client.get("/admin/v1/tenants", params={"limit": "5"}, headers=auth())).status_code == 200
    # given twice: the last would win unnoticed (found by a re-check QA); a long name is cut in the reply
    resp = await client.get("/admin/v1/audit", params=[("action", "key.create"), ("action", "key.revoke")],
                            headers=auth())
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "action", resp.text
    assert "more than once" in resp.json()["error"]["message"]
    resp = await client.get("/admin/v1/summary", params={"x" * 60_000: "1"}, headers=auth())
    assert resp.status_code == 400 and len(resp.text) < 1_000, len(resp.text)
    # given empty: ``/keys?tenant=`` listed every tenant's keys (found by a dashboard QA)
    for path, name in (("/admin/v1/keys", "tenant"), ("/admin/v1/keys", "prefix"), ("/admin/v1/audit", "action"),
                       ("/admin/v1/summary", "since")):
        resp = await client.get(path, params={name: ""}, headers=auth())
        assert resp.status_code == 400 and resp.json()["error"]["param"] == name, resp.text
        assert resp.json()["error"]["message"].startswith(f"{name}: must not be empty")


def test_the_body_limits_413_keeps_its_code_on_the_admin_api():
    """The gateway's body limit raises a 413 while a chunked body arrives; the admin API answered it
    with ``code: null`` (found by QA), where /v1 and a body with content-length say ``request_too_large``."""
    from starlette.exceptions import HTTPException

    from admin.api.routing import as_api_error

    err = as_api_error(HTTPException(413, "too large"))
    assert (err.status, err.code, err.type) == (413, "request_too_large", "invalid_request_error")
    assert as_api_error(HTTPException(400, "Field exceeded maximum size")).code is None


async def test_a_backwards_range_names_the_bound_that_was_sent(client, auth):
    """Found by QA: ``until`` alone, before the default ``since``, was blamed on ``since``."""
    resp = await client.get("/admin/v1/summary", params={"until": "0001-01-01"}, headers=auth())
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "until", resp.text
    resp = await client.get("/admin/v1/summary", params={"since": "2026-02-01", "until": "2026-01-01"},
                            headers=auth())
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "since", resp.text
    assert "2026-02-01" in resp.json()["error"]["message"]


async def test_a_time_finer_than_a_microsecond_is_refused(client, auth):
    """Found by QA: ``fromisoformat`` cut ``…00:00:00.0000001`` to ``…00:00:00``, so an ``until``
    moved earlier and a row on the wrong side of a bound was counted. Trailing zeros are exact."""
    resp = await client.get("/admin/v1/summary", params={"until": "2026-12-01T00:00:00.0000001Z"}, headers=auth())
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "until", resp.text
    assert "microsecond" in resp.json()["error"]["message"]
    resp = await client.get("/admin/v1/summary", params={"since": "2026-11-30T23:59:59.9999990Z"}, headers=auth())
    assert resp.status_code == 200 and resp.json()["since"].startswith("2026-11-30T23:59:59.999999"), resp.text


async def test_a_body_key_that_is_not_unicode_and_a_model_name_with_a_line_break(client, auth):
    """Found by a fuzzing QA: a body key holding a lone surrogate read "must be a JSON object, not
    a string"; a price for a model name with a line break was a 404 for an unknown URL."""
    resp = await client.post("/admin/v1/tenants", content=b'{"name":"sx5","x\\ud800":1}',
                             headers={**auth(), "content-type": "application/json"})
    assert resp.status_code == 400 and "not valid Unicode" in resp.json()["error"]["message"], resp.text
    for name in ("a%0Ab", "a%0D%0Ab", "%0A", "%ED%A0%80", "a%FFb"):  # (the last two: not UTF-8, read as U+FFFD)
        resp = await client.put(f"/admin/v1/prices/{name}", json={"prompt_usd_per_1m": 1, "completion_usd_per_1m": 1},
                                headers=auth())
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "model", resp.text
        resp = await client.delete(f"/admin/v1/prices/{name}", headers=auth())  # as PUT answers it (a re-check)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "model", resp.text


async def test_a_long_name_is_cut_in_the_admin_apis_errors(client, auth):
    """Found by a re-check: a 5,000-character model name came back whole in the 404 (the /v1 API
    cuts such a name to 256 characters)."""
    for method, path in (("DELETE", "/admin/v1/prices/" + "z" * 5000), ("GET", "/admin/v1/tenants/" + "t" * 3000),
                         ("GET", "/admin/v1/keys/" + "9" * 3000)):
        resp = await client.request(method, path, headers=auth())
        assert resp.status_code in (400, 404) and len(resp.content) < 700, (path[:30], resp.status_code, len(resp.content))
    resp = await client.get("/admin/v1/summary", params={"since": "s" * 3000}, headers=auth())
    assert resp.status_code == 400 and len(resp.content) < 900 and "3000 characters" in resp.text
