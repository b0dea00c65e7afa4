"""Admin writes that must hold under concurrency and say exactly what they did, on SQLite and
PostgreSQL: one winner among concurrent rotations, revocations and creations; no audit row or
invalidation for a change that changes nothing; request bodies read strictly (no loose types, no
null where a field cannot be cleared); key names without control characters."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import pytest
from admin_testlib import unique
from redis.asyncio import Redis
from sqlalchemy import func, select, text, update

from admin.management import Management
from gateway.db.models import AuditLog, Tenant
from gateway.db.session import Database
from gateway.tenancy import invalidation_version_key

PARALLEL = 10


async def _audit_count(app, action: str, target: str) -> int:
    async with app.state.admin_context.database.sessionmaker() as s:
        return await s.scalar(select(func.count()).select_from(AuditLog)
                              .where(AuditLog.action == action, AuditLog.target == target))


async def _version(settings) -> int:
    """The invalidation counter every publish bumps (no other test runs meanwhile)."""
    redis = Redis.from_url(settings.redis_url)
    try:
        return int(await redis.get(invalidation_version_key(settings.redis_prefix)) or 0)
    finally:
        await redis.aclose()


async def _tenant_with_key(client, auth) -> tuple[str, dict]:
    tenant = unique("race")
    assert (await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())).status_code == 201
    key = (await client.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "ci", "rpm": 7},
                             headers=auth())).json()
    return tenant, key


# --- concurrency ----------------------------------------------------------------------------------
async def test_concurrent_rotations_of_one_key_have_one_winner(client, app, auth, settings):
    tenant, key = await _tenant_with_key(client, auth)
    version = await _version(settings)
    replies = await asyncio.gather(*[client.post(f"/admin/v1/keys/{key['id']}/rotate", headers=auth())
                                     for _ in range(PARALLEL)])
    codes = sorted(r.status_code for r in replies)
    assert codes == [201] + [409] * (PARALLEL - 1), [r.text for r in replies]
    assert all(r.json()["error"]["code"] == "conflict" for r in replies if r.status_code == 409)
    (won,) = [r.json() for r in replies if r.status_code == 201]
    assert (won["name"], won["rpm"], won["replaces"]["id"]) == ("ci", 7, key["id"])

    keys = (await client.get(f"/admin/v1/tenants/{tenant}/keys", headers=auth())).json()["data"]
    assert sorted((k["id"], k["revoked"]) for k in keys) == [(key["id"], True), (won["id"], False)]
    assert await _audit_count(app, "key.rotate", f"key:{key['prefix']}") == 1
    assert await _version(settings) == version + 1


async def test_concurrent_revocations_of_one_key_write_one_audit_row(client, app, auth, settings):
    _, key = await _tenant_with_key(client, auth)
    version = await _version(settings)
    replies = await asyncio.gather(*[client.post(f"/admin/v1/keys/{key['id']}/revoke", headers=auth())
                                     for _ in range(PARALLEL)])
    assert [r.status_code for r in replies] == [200] * PARALLEL, [r.text for r in replies]
    assert all(r.json()["revoked"] for r in replies)
    assert len({r.json()["revoked_at"] for r in replies}) == 1  # every reply shows the one revocation
    assert await _audit_count(app, "key.revoke", f"key:{key['prefix']}") == 1
    assert await _version(settings) == version + 1
    # and a revoked key cannot be rotated afterwards either
    resp = await client.post(f"/admin/v1/keys/{key['id']}/rotate", headers=auth())
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "conflict"


async def test_concurrent_creations_of_one_tenant_are_one_201_and_409s(client, app, auth):
    name = unique("same")
    replies = await asyncio.gather(*[client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
                                     for _ in range(2 * PARALLEL)])
    assert sorted(r.status_code for r in replies) == [201] + [409] * (2 * PARALLEL - 1), [r.text for r in replies]
    for r in replies:
        if r.status_code == 409:
            assert r.json()["error"] == {"message": f"Tenant {name!r} already exists.",
                                         "type": "invalid_request_error", "param": None, "code": "conflict"}
    assert await _audit_count(app, "tenant.create", f"tenant:{name}") == 1


# --- changes that change nothing ------------------------------------------------------------------
async def test_changes_that_change_nothing_leave_no_audit_row_and_no_invalidation(client, app, auth, settings):
    name = unique("noop")
    body = {"name": name, "rpm": 60, "budget_usd": "12.5", "period": "day", "cache_threshold": 0.9}
    assert (await client.post("/admin/v1/tenants", json=body, headers=auth())).status_code == 201
    target = f"tenant:{name}"

    version = await _version(settings)
    first = await client.post(f"/admin/v1/tenants/{name}/disable", headers=auth())
    second = await client.post(f"/admin/v1/tenants/{name}/disable", headers=auth())
    assert first.status_code == second.status_code == 200 and second.json()["enabled"] is False
    assert second.json()["updated_at"] == first.json()["updated_at"]
    assert await _audit_count(app, "tenant.disable", target) == 1
    assert await _version(settings) == version + 1

    version = await _version(settings)
    for method, path, sent in (
        ("PATCH", "", {"rpm": 60, "budget_usd": 12.5, "period": "day", "cache_threshold": 0.9}),  # as stored
        ("PATCH", "", {"budget_usd": "12.50000000", "enabled": False}),
        ("PATCH", "", {"tpm": None, "budget_tokens": None}),  # already unset
        ("PATCH", "", {}),
        ("PUT", "/budget", {"budget_usd": "12.5"}),  # budget_tokens left out: cleared, as it is
        ("POST", "/disable", None),
    ):
        resp = await client.request(method, f"/admin/v1/tenants/{name}{path}", json=sent, headers=auth())
        assert resp.status_code == 200, (sent, resp.text)
    assert await _audit_count(app, "tenant.update", target) == 0
    assert await _audit_count(app, "tenant.disable", target) == 1
    assert await _version(settings) == version

    # a call that changes one field among unchanged ones records that change
    resp = await client.patch(f"/admin/v1/tenants/{name}", json={"rpm": 61, "period": "day"}, headers=auth())
    assert resp.status_code == 200 and resp.json()["rpm"] == 61
    assert await _audit_count(app, "tenant.update", target) == 1
    assert await _version(settings) == version + 1
    # enabling a disabled tenant among unchanged fields is recorded as the enable it is
    resp = await client.patch(f"/admin/v1/tenants/{name}", json={"rpm": 61, "enabled": True}, headers=auth())
    assert resp.status_code == 200 and resp.json()["enabled"] is True
    assert await _audit_count(app, "tenant.enable", target) == 1


async def test_setting_a_price_to_the_price_it_has_is_not_recorded(client, app, auth):
    model = unique("m")
    for sent in ({"prompt_usd_per_1m": "0.15", "completion_usd_per_1m": 0.6},
                 {"prompt_usd_per_1m": 0.15, "completion_usd_per_1m": "0.60000000"}):
        assert (await client.put(f"/admin/v1/prices/{model}", json=sent, headers=auth())).status_code == 200
    assert await _audit_count(app, "price.set", f"model:{model}") == 1


# --- strict bodies --------------------------------------------------------------------------------
@pytest.mark.parametrize("method,path,body,param", [
    ("POST", "/admin/v1/tenants", {"rpm": True}, "rpm"),
    ("POST", "/admin/v1/tenants", {"rpm": "12"}, "rpm"),
    ("POST", "/admin/v1/tenants", {"rpm": 12.0}, "rpm"),
    ("POST", "/admin/v1/tenants", {"tpm": False}, "tpm"),
    ("POST", "/admin/v1/tenants", {"budget_tokens": "5"}, "budget_tokens"),
    ("POST", "/admin/v1/tenants", {"cache_ttl_s": 60.0}, "cache_ttl_s"),
    ("POST", "/admin/v1/tenants", {"cache_max_entries": True}, "cache_max_entries"),
    ("POST", "/admin/v1/tenants", {"enabled": "yes"}, "enabled"),
    ("POST", "/admin/v1/tenants", {"enabled": 1}, "enabled"),
    ("POST", "/admin/v1/tenants", {"cache_enabled": "false"}, "cache_enabled"),
    ("POST", "/admin/v1/tenants", {"cache_threshold": "0.9"}, "cache_threshold"),
    ("POST", "/admin/v1/tenants", {"cache_threshold": True}, "cache_threshold"),
    ("POST", "/admin/v1/tenants", {"period": None}, "period"),
    ("PATCH", "/admin/v1/tenants/{t}", {"rpm": True}, "rpm"),
    ("PATCH", "/admin/v1/tenants/{t}", {"rpm": "12"}, "rpm"),
    ("PATCH", "/admin/v1/tenants/{t}", {"enabled": "yes"}, "enabled"),
    ("PATCH", "/admin/v1/tenants/{t}", {"period": None}, "period"),
    ("PATCH", "/admin/v1/tenants/{t}", {"enabled": None}, "enabled"),
    ("PATCH", "/admin/v1/tenants/{t}", {"cache_enabled": None}, "cache_enabled"),
    ("PUT", "/admin/v1/tenants/{t}/budget", {"budget_tokens": 1.0}, "budget_tokens"),
    ("PUT", "/admin/v1/tenants/{t}/budget", {"period": None}, "period"),
    ("POST", "/admin/v1/tenants/{t}/keys", {"rpm": True}, "rpm"),
    ("POST", "/admin/v1/tenants/{t}/keys", {"rpm": "5"}, "rpm"),
    # money as a string is plain decimal notation, as the CLI takes it (Decimal() reads more)
    ("POST", "/admin/v1/tenants", {"budget_usd": "1_000"}, "budget_usd"),
    ("PATCH", "/admin/v1/tenants/{t}", {"budget_usd": " 5"}, "budget_usd"),
    ("PATCH", "/admin/v1/tenants/{t}", {"budget_usd": "+5"}, "budget_usd"),
    ("PATCH", "/admin/v1/tenants/{t}", {"budget_usd": "1e3"}, "budget_usd"),
    ("PUT", "/admin/v1/tenants/{t}/budget", {"budget_usd": "٣"}, "budget_usd"),
    ("PUT", "/admin/v1/prices/m-{t}", {"prompt_usd_per_1m": "1_0", "completion_usd_per_1m": 1}, "prompt_usd_per_1m"),
    ("PUT", "/admin/v1/prices/m-{t}", {"prompt_usd_per_1m": 1, "completion_usd_per_1m": "5E-1"},
     "completion_usd_per_1m"),
])
async def test_loose_types_and_nulls_that_cannot_clear_are_400(client, app, auth, method, path, body, param):
    tenant = unique("strict")
    assert (await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())).status_code == 201
    if path == "/admin/v1/tenants":
        body = {"name": unique("s"), **body}
    resp = await client.request(method, path.replace("{t}", tenant), json=body, headers=auth())
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert error["code"] in ("invalid_type", "invalid_value"), error
    assert error["message"].startswith(f"{param}: ")
    got = (await client.get(f"/admin/v1/tenants/{tenant}", headers=auth())).json()
    assert (got["rpm"], got["enabled"], got["period"], got["cache_enabled"]) == (None, True, "month", True)
    assert await _audit_count(app, "tenant.update", f"tenant:{tenant}") == 0


async def test_money_strings_in_plain_notation_and_json_numbers_in_any_form_are_taken(client, auth):
    """A JSON number may use exponents (Python's json writes 0.00001 as 1e-05); a string is plain."""
    name = unique("money")
    assert (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).status_code == 201
    for body, stored in (('"1000"', "1000"), ('".5"', "0.5"), ('"2."', "2"), ("1E+3", "1000"), ("1e-05", "0.00001")):
        resp = await client.patch(f"/admin/v1/tenants/{name}", content=f'{{"budget_usd": {body}}}',
                                  headers={**auth(), "content-type": "application/json"})
        assert resp.status_code == 200, (body, resp.text)
        assert json.loads(resp.text, parse_float=Decimal)["budget_usd"] == Decimal(stored), body


async def test_strict_bodies_still_take_what_they_should(client, auth):
    name = unique("fine")
    resp = await client.post("/admin/v1/tenants", headers=auth(), json={
        "name": name, "rpm": 12, "tpm": 0, "budget_tokens": 2**63 - 1, "enabled": False, "cache_enabled": False,
        "cache_threshold": 0.9, "cache_ttl_s": 60, "budget_usd": 2, "period": "day"})
    assert resp.status_code == 201, resp.text
    got = resp.json()
    assert (got["rpm"], got["enabled"], got["cache_threshold"], got["budget_usd"]) == (12, False, 0.9, 2)
    resp = await client.post("/admin/v1/tenants", json={"name": unique("one"), "cache_threshold": 1}, headers=auth())
    assert resp.status_code == 201 and resp.json()["cache_threshold"] == 1
    resp = await client.patch(f"/admin/v1/tenants/{name}", json={"rpm": None, "budget_usd": "3"}, headers=auth())
    assert resp.status_code == 200 and (resp.json()["rpm"], resp.json()["budget_usd"]) == (None, 3)
    resp = await client.put(f"/admin/v1/tenants/{name}/budget", json={"budget_tokens": 5}, headers=auth())
    assert resp.status_code == 200 and (resp.json()["budget_tokens"], resp.json()["period"]) == (5, "day")


# --- key names ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["web\nprod", "web\r", "\tweb", "nul\x00", "del\x7f", "c1\x85", "ls\u2028x"])
async def test_key_names_with_control_characters_are_refused(client, app, auth, bad):
    tenant = unique("kname")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": bad}, headers=auth())
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "name"
    assert resp.json()["error"]["message"] == "name: must not contain control, format or line-break characters"
    assert (await client.get(f"/admin/v1/tenants/{tenant}/keys", headers=auth())).json()["data"] == []


async def test_key_names_may_hold_any_printable_text(client, auth):
    tenant = unique("kname")
    await client.post("/admin/v1/tenants", json={"name": tenant}, headers=auth())
    for name in ("web prod", "Café – ✓ 日本"):
        resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": name}, headers=auth())
        assert resp.status_code == 201 and resp.json()["name"] == name, resp.text
    for blank in ("", "  "):  # no name, as the dashboard's empty field (found by QA: "" here, null there)
        resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": blank}, headers=auth())
        assert resp.status_code == 201 and resp.json()["name"] is None, resp.text
    resp = await client.post(f"/admin/v1/tenants/{tenant}/keys", json={"allowed_models": ["x", "y", "x"]},
                             headers=auth())
    assert resp.status_code == 201 and resp.json()["allowed_models"] == ["x", "y"], resp.text


# --- two identical changes at once ----------------------------------------------------------------
async def _waiting_on_locks(db, count: int) -> None:
    """Until ``count`` other sessions of this database wait on a lock (PostgreSQL)."""
    for _ in range(500):
        async with db.sessionmaker() as s:
            waiting = await s.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                          "AND wait_event_type = 'Lock'"))
        if waiting >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} sessions never waited on the tenant's row lock")


async def test_two_disables_at_once_record_one(db_url, settings):
    """Both admins read the tenant as enabled before either commits (held there by a third session's
    row lock); the second must then see the first's disable: one tenant.disable, one no-op."""
    db = Database(settings.database_url)
    try:
        name = unique("twice")
        async with db.sessionmaker() as s:
            await Management(session=s, actor="setup").create_tenant(name=name)
        async with db.sessionmaker() as blocker, db.sessionmaker() as one, db.sessionmaker() as two:
            if db.dialect == "sqlite":  # no row locks: the database's write lock, held by a write
                await blocker.execute(update(Tenant).where(Tenant.name == name).values(rpm_limit=None))
            else:
                await blocker.execute(select(Tenant.id).where(Tenant.name == name).with_for_update())
            both = asyncio.gather(*(Management(session=s, actor=who).apply_enabled(name, False)
                                    for s, who in ((one, "alice"), (two, "bob"))))
            if db.dialect == "sqlite":  # (no view of who waits: both have read the tenant by then)
                await asyncio.sleep(0.5)
            else:
                await _waiting_on_locks(db, 2)
            await blocker.commit()
            results = await both
        assert sorted(changed for _, changed in results) == [False, True]
        assert all(t.enabled is False for t, _ in results)
        async with db.sessionmaker() as s:
            actions = (await s.scalars(select(AuditLog.action).where(AuditLog.target == f"tenant:{name}"))).all()
        assert sorted(actions) == ["tenant.create", "tenant.disable"]
    finally:
        await db.dispose()


async def test_a_signed_money_string_is_refused_and_a_negative_zero_number_is_stored_as_zero(client, auth):
    """Found by QA: ``{"budget_usd": "-0"}`` was taken (it passes ">= 0") although a money string is
    digits with at most one point, as "+5" is refused: it is now a 400 naming the field. A JSON
    number ``-0.0`` is a number and is taken, as 0: stored and shown as 0.00000000, never -0.00000000."""
    name = unique("negzero")
    assert (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).status_code == 201
    for method, path, body, param in (
            ("PATCH", f"/admin/v1/tenants/{name}", {"budget_usd": "-0"}, "budget_usd"),
            ("PUT", f"/admin/v1/tenants/{name}/budget", {"budget_usd": "-0.00"}, "budget_usd"),
            ("POST", "/admin/v1/tenants", {"name": unique("nz"), "budget_usd": "-0"}, "budget_usd"),
            ("PUT", f"/admin/v1/prices/m-{name}", {"prompt_usd_per_1m": "-0", "completion_usd_per_1m": 1},
             "prompt_usd_per_1m")):
        resp = await client.request(method, path, json=body, headers=auth())
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, (body, resp.text)
        assert "no sign" in resp.json()["error"]["message"]
    for body in ("-0.0", "-0e0", "-0.00000000"):
        resp = await client.patch(f"/admin/v1/tenants/{name}", content=f'{{"budget_usd": {body}}}',
                                  headers={**auth(), "content-type": "application/json"})
        assert resp.status_code == 200 and '"budget_usd":0.00000000' in resp.text, (body, resp.text)
        got = await client.get(f"/admin/v1/tenants/{name}", headers=auth())
        assert '"budget_usd":0.00000000' in got.text, (body, got.text)
    resp = await client.put(f"/admin/v1/prices/m-{name}", content='{"prompt_usd_per_1m": -0.0, "completion_usd_per_1m": 1}',
                            headers={**auth(), "content-type": "application/json"})
    assert resp.status_code == 200 and '"prompt_usd_per_1m":0.00000000' in resp.text, resp.text


async def test_concurrent_first_prices_of_a_model_are_all_answered(client, app, auth):
    """Found by QA: concurrent PUTs of a model without a price raced on its insert and some were 500s
    (a duplicate primary key). Each is answered; the price is one of those sent."""
    model = unique("race-model")
    replies = await asyncio.gather(*[
        client.put(f"/admin/v1/prices/{model}", json={"prompt_usd_per_1m": i, "completion_usd_per_1m": 1},
                   headers=auth()) for i in range(PARALLEL)])
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    prices = {p["model"]: p for p in (await client.get("/admin/v1/prices", headers=auth())).json()["data"]}
    assert Decimal(str(prices[model]["prompt_usd_per_1m"])) in {Decimal(i) for i in range(PARALLEL)}
    assert 1 <= await _audit_count(app, "price.set", f"model:{model}") <= PARALLEL


async def test_the_audit_log_keeps_long_targets_and_actors_whole(client, auth):
    """Found by QA: ``tenant:`` plus a 128-character name (and a long token subject) was cut to 128
    characters, so filtering by the tenant's target found nothing."""
    base = unique("t")
    name = base + "n" * (128 - len(base))
    assert len(name) == 128
    actor = "svc-" + "a" * 252  # (the longest subject a token may have: 256)
    assert (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth(sub=actor))).status_code == 201
    rows = (await client.get("/admin/v1/audit", params={"target": f"tenant:{name}"}, headers=auth())).json()["data"]
    assert [(r["action"], r["actor"]) for r in rows] == [("tenant.create", actor)]


async def test_concurrent_price_changes_each_record_the_price_they_replaced(client, app, auth):
    """Found by a recheck QA: concurrent PUTs each read the same price as their audit row's
    ``before`` (five rows claimed to create the price). In commit order, each row's ``before`` is
    the ``after`` of the row before it."""
    model = unique("chain")
    replies = await asyncio.gather(*[
        client.put(f"/admin/v1/prices/{model}", json={"prompt_usd_per_1m": i + 1, "completion_usd_per_1m": 1},
                   headers=auth()) for i in range(PARALLEL)])
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    rows = (await client.get("/admin/v1/audit", params={"target": f"model:{model}", "limit": 100},
                             headers=auth())).json()["data"][::-1]  # oldest first
    assert rows[0]["before"] is None and all(r["before"] is not None for r in rows[1:])
    for earlier, later in zip(rows, rows[1:], strict=False):
        assert later["before"] == earlier["after"], (earlier, later)
