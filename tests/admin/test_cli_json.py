"""``pagegate admin … --json`` against real SQLite/PostgreSQL: one JSON document on stdout, equal to
what the admin API returns for the same question; the audit log paged with ``--before``;
``--json`` with ``--csv`` refused as a usage error."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime
from decimal import Decimal

import pytest
from admin_testlib import unique, usage_row
from sqlalchemy import select

from admin import cli
from gateway.db.models import AuditLog, Tenant

SINCE, UNTIL = "2026-07-01T00:00:00+00:00", "2026-07-03T00:00:00+00:00"


async def cli_json(capsys, *argv: str):
    """Run the CLI (on a thread: it runs its own event loop); its stdout must be one JSON document."""
    code = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.endswith("\n") and out.count("\n") == 1, out  # one document, one line
    return json.loads(out, parse_float=Decimal)


async def api(client, auth, path: str, **params):
    resp = await client.get(path, params=params, headers=auth("admin:read"))
    assert resp.status_code == 200, resp.text
    return json.loads(resp.text, parse_float=Decimal)


async def test_json_output_equals_the_api_reply(env, capsys, client, app, auth):
    name = unique("json")
    model = unique("json-model")
    assert (await client.post("/admin/v1/tenants", json={"name": name, "budget_usd": "12.5"},
                              headers=auth())).status_code == 201
    keys = [(await client.post(f"/admin/v1/tenants/{name}/keys", json={"name": f"k{i}"}, headers=auth())).json()
            for i in range(3)]
    assert (await client.post(f"/admin/v1/keys/{keys[1]['id']}/revoke", headers=auth())).status_code == 200
    assert (await client.put(f"/admin/v1/prices/{model}", json={"prompt_usd_per_1m": "0.15",
                                                                "completion_usd_per_1m": "0.6"},
                             headers=auth())).status_code == 200
    async with app.state.admin_context.database.sessionmaker() as s:
        tid = await s.scalar(select(Tenant.id).where(Tenant.name == name))
        s.add_all(usage_row(tenant_id=tid, key_id=keys[0]["id"], model=model, when=datetime.fromisoformat(SINCE),
                            prompt=10 * i, cached=0, completion=5, cost="0.00012345", latency=20.0 + i)
                  for i in range(1, 4))
        await s.commit()

    pairs = [
        (["keys", "list", "--tenant", name], ("/admin/v1/keys", {"tenant": name})),
        (["keys", "list", "--tenant", name, "--active"], ("/admin/v1/keys", {"tenant": name,
                                                                             "include_revoked": "false"})),
        (["prices", "list"], ("/admin/v1/prices", {})),
        (["audit", "--target", f"tenant:{name}"], ("/admin/v1/audit", {"target": f"tenant:{name}", "limit": 50})),
        (["report", "--tenant", name, "--since", SINCE, "--until", UNTIL, "--group-by", "key"],
         (f"/admin/v1/tenants/{name}/report", {"since": SINCE, "until": UNTIL, "group_by": "key"})),
        (["summary", "--since", SINCE, "--until", UNTIL], ("/admin/v1/summary", {"since": SINCE, "until": UNTIL})),
    ]
    for argv, (path, params) in pairs:
        assert await cli_json(capsys, *argv, "--json") == await api(client, auth, path, **params), argv

    listed = await cli_json(capsys, "keys", "list", "--tenant", name, "--json")
    assert [k["id"] for k in listed["data"]] == [k["id"] for k in keys]
    assert (listed["has_more"], listed["first_id"], listed["last_id"]) == (False, keys[0]["id"], keys[-1]["id"])
    report = await cli_json(capsys, "report", "--tenant", name, "--since", SINCE, "--until", UNTIL, "--json")
    assert report["total"]["requests"] == 3 and report["total"]["cost_usd"] == Decimal("0.00037035")

    shown = await cli_json(capsys, "tenants", "show", name, "--json")
    assert shown["keys"] == await api(client, auth, f"/admin/v1/tenants/{name}/keys")
    assert shown["budget"] == await api(client, auth, f"/admin/v1/tenants/{name}/budget")
    tenant = {k: v for k, v in shown.items() if k not in ("keys", "budget")}
    assert tenant == await api(client, auth, f"/admin/v1/tenants/{name}")
    assert tenant["budget_usd"] == Decimal("12.50000000")


async def test_tenants_list_json_holds_every_page_of_the_api(env, capsys, client, auth):
    """The CLI prints every tenant, by id, in one list: the API's pages joined."""
    names = [unique("json-all") for _ in range(3)]
    for name in names:
        assert (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).status_code == 201
    pages, after = [], None
    while True:
        page = await api(client, auth, "/admin/v1/tenants", limit=2, **({"after": after} if after else {}))
        pages.append(page)
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert len(pages) > 1  # this test's own tenants, and those of the session's other tests
    everything = [t for p in pages for t in p["data"]]
    listed = await cli_json(capsys, "tenants", "list", "--json")
    assert listed == {"object": "list", "data": everything, "has_more": False,
                      "first_id": everything[0]["id"], "last_id": everything[-1]["id"]}
    assert set(names) <= {t["name"] for t in listed["data"]}


async def test_audit_pages_with_before_and_past_1000(env, capsys, client, app, auth):
    target = f"test:{uuid.uuid4().hex}"
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add_all(AuditLog(actor="test", action="test.row", target=target, detail=str(i)) for i in range(1002))
        await s.commit()
        ids = list((await s.execute(select(AuditLog.id).where(AuditLog.target == target)
                                    .order_by(AuditLog.id.desc()))).scalars())

    first = await cli_json(capsys, "audit", "--target", target, "--limit", "1000", "--json")
    assert [e["id"] for e in first["data"]] == ids[:1000] and first["has_more"] is True
    assert first == await api(client, auth, "/admin/v1/audit", target=target, limit=1000)
    rest = await cli_json(capsys, "audit", "--target", target, "--before", str(first["last_id"]), "--json")
    assert [e["id"] for e in rest["data"]] == ids[1000:] and rest["has_more"] is False
    assert rest == await api(client, auth, "/admin/v1/audit", target=target, after=first["last_id"], limit=50)
    # the API stops at 1000 a page; the CLI, on the database itself, does not
    whole = await cli_json(capsys, "audit", "--target", target, "--limit", "5000", "--json")
    assert [e["id"] for e in whole["data"]] == ids and whole["has_more"] is False

    # a table says where the next page starts (on stderr: stdout keeps the table alone)
    code = await asyncio.to_thread(cli.main, ["audit", "--target", target, "--limit", "2"])
    out, err = capsys.readouterr()
    assert code == 0 and err == f"older entries follow: --before {ids[1]}\n"
    assert [ln.split()[0] for ln in out.splitlines()[2:]] == [f"{i:,}" for i in ids[:2]]
    code = await asyncio.to_thread(cli.main, ["audit", "--target", target, "--before", str(ids[1])])
    out, err = capsys.readouterr()
    assert code == 0 and err == f"older entries follow: --before {ids[51]}\n" and len(out.splitlines()) == 2 + 50


@pytest.mark.parametrize("argv", [["report", "--tenant", "acme", "--json", "--csv"],
                                  ["summary", "--csv", "--json"]])
def test_json_and_csv_together_is_a_usage_error(capsys, argv):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    out, err = capsys.readouterr()
    assert done.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "not allowed with argument" in err and "usage:" not in err


@pytest.mark.parametrize("argv,reason", [
    (["audit", "--before", "0"], "argument --before: must be a whole number > 0, not '0'"),
    (["audit", "--before", "x"], "argument --before: not a whole number: 'x'"),
    (["audit", "--before", str(2**31)], f"argument --before: at most 2147483647, not '{2**31}'"),  # no such id
    (["audit", "--limit", str(2**31)], f"argument --limit: at most 2147483647, not '{2**31}'"),
    (["tenants", "create", "x", "--json"], "unrecognized arguments: --json"),  # only reads print JSON
])
def test_bad_paging_options_are_usage_errors(capsys, argv, reason):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1 and reason in err, err
