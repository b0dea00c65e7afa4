"""Deleting a tenant (``DELETE /admin/v1/tenants/{name}``, ``pagegate admin tenants delete``) on
SQLite and PostgreSQL: its keys revoked and pushed to the gateways, the tenant gone from lists and
lookups, its row and usage history kept for reports, its name not free again, one audit row."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from admin_testlib import unique, usage_row
from redis.asyncio import Redis
from sqlalchemy import select

from admin import cli
from gateway.db.models import ApiKey, AuditLog, Tenant
from gateway.tenancy import invalidation_channel


async def _rows(app, model, *where):  # noqa: ANN001, ANN202
    async with app.state.admin_context.database.sessionmaker() as s:
        return list((await s.execute(select(model).where(*where))).scalars())


async def test_delete_revokes_keys_hides_the_tenant_and_keeps_its_history(client, app, auth, settings):
    name = unique("gone")
    tid = (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).json()["id"]
    for _ in range(2):
        assert (await client.post(f"/admin/v1/tenants/{name}/keys", json={}, headers=auth())).status_code == 201
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add(usage_row(tenant_id=tid, key_id=None, model="m", when=datetime.now(UTC), prompt=10, cached=0,
                        completion=5, cost="0.25", latency=12.0))
        await s.commit()
    redis = Redis.from_url(settings.redis_url)
    pubsub = redis.pubsub()
    await pubsub.subscribe(invalidation_channel(settings.redis_prefix, redis))
    await pubsub.get_message(timeout=1.0)

    assert (await client.delete(f"/admin/v1/tenants/{name}", headers=auth("admin:read"))).status_code == 403
    resp = await client.delete(f"/admin/v1/tenants/{name}", headers=auth(sub="erin"))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert (body["deleted"], body["keys_revoked"], body["enabled"]) == (True, 2, False) and body["deleted_at"]
    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=2.0)
    assert msg is not None and msg["data"] == f"tenant:{tid}".encode()  # gateways drop its keys at once
    await pubsub.aclose()
    await redis.aclose()

    assert all(k.revoked for k in await _rows(app, ApiKey, ApiKey.tenant_id == tid))
    assert (await client.get(f"/admin/v1/tenants/{name}", headers=auth())).status_code == 404
    listed = (await client.get("/admin/v1/tenants", params={"after": tid - 1} if tid > 1 else {},
                               headers=auth())).json()["data"]
    assert name not in [t["name"] for t in listed]
    assert (await client.post(f"/admin/v1/tenants/{name}/keys", json={}, headers=auth())).status_code == 404
    assert (await client.delete(f"/admin/v1/tenants/{name}", headers=auth())).status_code == 404  # once
    again = await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
    assert again.status_code == 409 and "deleted" in again.json()["error"]["message"]
    # the row and its usage stay: the summary still bills it
    (row,) = await _rows(app, Tenant, Tenant.id == tid)
    assert row.deleted_at is not None and row.name == name
    summary = (await client.get("/admin/v1/summary", headers=auth())).json()
    assert [r["cost_usd"] for r in summary["rows"] if r["group"] == name] == [0.25]
    (entry,) = await _rows(app, AuditLog, AuditLog.action == "tenant.delete", AuditLog.target == f"tenant:{name}")
    assert entry.actor == "erin" and entry.detail == "2 key(s) revoked"


async def test_two_deletes_at_once_delete_once(client, app, auth):
    name = unique("race")
    await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
    codes = sorted(r.status_code for r in await asyncio.gather(
        *(client.delete(f"/admin/v1/tenants/{name}", headers=auth()) for _ in range(4))))
    assert codes[0] == 200 and set(codes[1:]) == {404}, codes
    assert len(await _rows(app, AuditLog, AuditLog.action == "tenant.delete",
                           AuditLog.target == f"tenant:{name}")) == 1


def test_cli_delete_needs_yes(env, capsys):  # noqa: ANN001
    name = unique("clidel")
    assert cli.main(["tenants", "create", name]) == 0
    with pytest.raises(SystemExit) as info:
        cli.main(["tenants", "delete", name])
    assert info.value.code == 2 and "--yes" in capsys.readouterr().err
    assert cli.main(["tenants", "delete", name, "--yes"]) == 0
    assert f"deleted tenant {name}" in capsys.readouterr().err
    assert cli.main(["tenants", "list"]) == 0 and name not in capsys.readouterr().out
    assert cli.main(["tenants", "show", name]) == 1 and "No tenant" in capsys.readouterr().err


async def test_a_delete_racing_new_keys_and_an_enable_leaves_nothing_alive(client, app, auth):
    """Keys created and an enable sent while the tenant is deleted: whatever order they land in,
    a deleted tenant ends with no active key and disabled (a QA find: some rounds left live keys,
    answered 200 by the gateway, and re-enabled the deleted tenant)."""
    for _ in range(6):
        name = unique("race")
        await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
        await client.post(f"/admin/v1/tenants/{name}/disable", headers=auth())
        await asyncio.gather(*[client.post(f"/admin/v1/tenants/{name}/keys", json={}, headers=auth())
                               for _ in range(3)],
                             client.delete(f"/admin/v1/tenants/{name}", headers=auth()),
                             client.post(f"/admin/v1/tenants/{name}/enable", headers=auth()))
        (tenant,) = await _rows(app, Tenant, Tenant.name == name)
        assert tenant.deleted_at is not None
        assert tenant.enabled is False
        assert [k.id for k in await _rows(app, ApiKey, ApiKey.tenant_id == tenant.id) if not k.revoked] == []


async def test_a_deleted_tenants_history_stays_readable_but_not_changeable(client, app, auth, env, capsys):
    """Its report, budget and keys (API, CLI, dashboard) still find a deleted tenant and say it is
    deleted; every change still 404s (a QA find: the report of a deleted tenant was a 404)."""
    name = unique("history")
    tid = (await client.post("/admin/v1/tenants", json={"name": name, "budget_usd": "3"}, headers=auth())).json()["id"]
    key = (await client.post(f"/admin/v1/tenants/{name}/keys", json={}, headers=auth())).json()
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add(usage_row(tenant_id=tid, key_id=key["id"], model="m", when=datetime.now(UTC), prompt=10, cached=0,
                        completion=5, cost="0.000015", latency=12.0))
        await s.commit()
    assert (await client.delete(f"/admin/v1/tenants/{name}", headers=auth())).status_code == 200

    report = await client.get(f"/admin/v1/tenants/{name}/report", params={"group_by": "model"}, headers=auth())
    assert report.status_code == 200, report.text
    assert (report.json()["tenant"], report.json()["total"]["requests"], report.json()["total"]["cost_usd"]) == (
        name, 1, 0.000015)
    budget = (await client.get(f"/admin/v1/tenants/{name}/budget", headers=auth("admin:read"))).json()
    assert budget["deleted_at"] and budget["spent_tokens"] == 15 and budget["budget_usd"] == 3
    for path, params in (("/admin/v1/keys", {"tenant": name}), (f"/admin/v1/tenants/{name}/keys", {})):
        listed = (await client.get(path, params=params, headers=auth())).json()["data"]
        assert [(k["id"], k["revoked"]) for k in listed] == [(key["id"], True)], path
    alive = (await client.post("/admin/v1/tenants", json={"name": unique("alive")}, headers=auth())).json()
    assert (await client.get(f"/admin/v1/tenants/{alive['name']}/budget", headers=auth())).json()["deleted_at"] is None

    for method, path, body in (("GET", f"/admin/v1/tenants/{name}", None),
                               ("PATCH", f"/admin/v1/tenants/{name}", {"rpm": 5}),
                               ("PUT", f"/admin/v1/tenants/{name}/budget", {"budget_tokens": 9}),
                               ("POST", f"/admin/v1/tenants/{name}/keys", {}),
                               ("POST", f"/admin/v1/tenants/{name}/enable", None),
                               ("POST", f"/admin/v1/tenants/{name}/disable", None)):
        resp = await client.request(method, path, json=body, headers=auth())
        assert resp.status_code == 404 and "No tenant named" in resp.json()["error"]["message"], (method, path)

    async def run_cli(*argv: str) -> tuple[int, str, str]:
        code = await asyncio.to_thread(cli.main, list(argv))  # on a thread: the CLI runs its own loop
        return code, *capsys.readouterr()

    code, out, err = await run_cli("report", "--tenant", name, "--group-by", "model")
    assert code == 0 and "0.000015" in out and f"note: tenant {name} was deleted at " in err, err
    code, out, err = await run_cli("keys", "list", "--tenant", name)
    assert code == 0 and key["prefix"] in out and "was deleted" in err
    code, _, err = await run_cli("tenants", "update", name, "--rpm", "5")
    assert code == 1 and "No tenant named" in err

    # the dashboard's tenant page: figures and keys, marked deleted, no forms
    signed_in = await client.post("/admin/login", data={"token": auth()["authorization"].removeprefix("Bearer ")})
    assert signed_in.status_code == 303
    page = await client.get(f"/admin/tenants/{name}")
    assert page.status_code == 200 and 'id="tenant-deleted"' in page.text and key["prefix"] in page.text
    assert 'id="stat-cost">$0.000015<' in page.text
    assert "<form" not in page.text.split("</header>", 1)[1]


async def test_delete_purges_the_tenants_cached_answers(client, app, auth, settings):
    """Found by QA: a deleted tenant's semantic-cache entries (its prompts and the answers stored for
    them) stayed in Redis until their TTL, 24 h by default. They go with the delete; another tenant's
    stay."""
    import numpy as np

    from cache.store import EntryStore, NewEntry

    names = [unique("purged"), unique("kept")]
    ids = [(await client.post("/admin/v1/tenants", json={"name": n}, headers=auth())).json()["id"] for n in names]
    from gateway.db.models import Tenant
    from gateway.db.session import Database
    from gateway.tenancy import cache_namespace

    db = Database(settings.database_url)
    async with db.sessionmaker() as s:  # the namespaces the gateway gives the tenants' entries
        spaces = [cache_namespace(await s.get(Tenant, tid)) for tid in ids]
    await db.dispose()
    # and, for the one deleted, the bare id under which earlier releases stored them
    spaces.append(str(ids[0]))
    redis = Redis.from_url(settings.redis_url)
    store = EntryStore(redis, settings.redis_prefix)
    for ns in spaces:
        keys = store.keys(ns)
        vec = np.ones(4, np.float32) / 2
        await store.put(keys, NewEntry(entry_id=f"e{ns}", ns=keys.ns("ctx"), text="What is the secret plan?",
                                       vec=vec, response={"answer": "the secret"}), ttl_s=3600, max_entries=10)
    bases = [store.keys(ns).base for ns in spaces]
    before = [[k async for k in redis.scan_iter(match=b + "*")] for b in bases]
    assert all(len(keys) >= 3 for keys in before), before  # the entry, its zset, its stamps...
    assert (await client.delete(f"/admin/v1/tenants/{names[0]}", headers=auth())).status_code == 200
    assert [k async for k in redis.scan_iter(match=bases[0] + "*")] == []
    assert [k async for k in redis.scan_iter(match=bases[2] + "*")] == []
    assert sorted([k async for k in redis.scan_iter(match=bases[1] + "*")]) == sorted(before[1])
    assert await store.get_response(store.keys(spaces[1]), f"e{spaces[1]}") == {"answer": "the secret"}
    await redis.aclose()


async def test_clear_cache_drops_one_tenants_answers_now(client, app, auth, settings, env, capsys):
    """Found by QA: an admin who finds a wrong answer stored had no way to drop it short of deleting the
    tenant (a lower cache_ttl_s does not shorten entries already stored). ``DELETE
    /admin/v1/tenants/{name}/cache`` and ``pagegate admin tenants clear-cache NAME`` drop that tenant's
    entries (another's stay), with an audit row; the tenant itself is untouched."""
    import numpy as np

    from cache.store import EntryStore, NewEntry
    from gateway.db.session import Database
    from gateway.tenancy import cache_namespace

    names = [unique("cleared"), unique("kept")]
    ids = [(await client.post("/admin/v1/tenants", json={"name": n}, headers=auth())).json()["id"] for n in names]
    db = Database(settings.database_url)
    async with db.sessionmaker() as s:
        spaces = [cache_namespace(await s.get(Tenant, tid)) for tid in ids]
    await db.dispose()
    redis = Redis.from_url(settings.redis_url)
    store = EntryStore(redis, settings.redis_prefix)

    async def fill() -> None:
        for ns in spaces:
            keys = store.keys(ns)
            await store.put(keys, NewEntry(entry_id=f"e{ns}", ns=keys.ns("ctx"), text="What is the plan?",
                                           vec=np.ones(4, np.float32) / 2, response={"answer": "x"}),
                            ttl_s=3600, max_entries=10)

    async def left(ns: str) -> list:
        return [k async for k in redis.scan_iter(match=store.keys(ns).base + "*")]

    await fill()
    kept = sorted(await left(spaces[1]))
    resp = await client.delete(f"/admin/v1/tenants/{names[0]}/cache", headers=auth())
    assert resp.status_code == 200, resp.text
    assert resp.json()["cache_cleared"] is True and resp.json()["answers_removed"] == 1
    assert resp.json()["redis_keys_removed"] >= 3  # (and the tenant's index keys)
    assert await left(spaces[0]) == [] and sorted(await left(spaces[1])) == kept
    tenant = (await client.get(f"/admin/v1/tenants/{names[0]}", headers=auth())).json()
    assert tenant["enabled"] is True and tenant["deleted_at"] is None
    audit = (await client.get("/admin/v1/audit", params={"target": f"tenant:{names[0]}"}, headers=auth())).json()
    assert "tenant.cache_clear" in [row["action"] for row in audit["data"]]
    assert (await client.delete("/admin/v1/tenants/nobody-at-all/cache", headers=auth())).status_code == 404
    assert (await client.delete(f"/admin/v1/tenants/{names[0]}/cache",
                                headers=auth("admin:read"))).status_code == 403

    await fill()  # the CLI, against the same database and Redis
    code = await asyncio.to_thread(cli.main, ["tenants", "clear-cache", names[0]])
    _out, err = capsys.readouterr()
    assert code == 0 and f"cleared the semantic cache of tenant {names[0]}: 1 stored answer(s) removed" in err, err
    assert await left(spaces[0]) == [] and sorted(await left(spaces[1])) == kept
    await redis.aclose()
