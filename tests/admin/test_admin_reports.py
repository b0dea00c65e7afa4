"""Reports: totals and groups equal the usage rows inserted, percentiles match an independent
oracle, CSV round-trips, and the cross-tenant summary adds up."""

from __future__ import annotations

import csv
import io
import json
import random
import re
import statistics
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from admin_testlib import unique, usage_row
from sqlalchemy import func, select

from admin import reports
from gateway.db.models import UsageRecord

SINCE = datetime(2026, 3, 1, tzinfo=UTC)
UNTIL = datetime(2026, 3, 4, tzinfo=UTC)


def _q(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return round(cuts[int(q * 100) - 1], 3)


@pytest.fixture
async def seeded(client, app, auth):
    """Two tenants, keys, and usage rows over three days plus rows outside the range."""
    rng = random.Random(7)
    names = [unique("rep"), unique("rep")]
    tenants, keys = {}, defaultdict(list)
    for name in names:
        tenants[name] = (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).json()
        for label in ("web", "batch", None):  # (an unnamed key is shown by its prefix alone)
            body = {"name": label} if label else {}
            k = (await client.post(f"/admin/v1/tenants/{name}/keys", json=body, headers=auth())).json()
            keys[name].append(k)
    rows = []
    for name in names:
        tid = tenants[name]["id"]
        for i in range(40):
            key = keys[name][i % 3]
            hit = i % 5 == 0
            when = SINCE + timedelta(hours=rng.randrange(0, 72), minutes=rng.randrange(60))
            rows.append(usage_row(
                tenant_id=tid, key_id=key["id"], model=("alpha" if i % 3 else "beta/v2"), when=when,
                prompt=rng.randrange(10, 500), cached=rng.randrange(0, 10), completion=rng.randrange(1, 300),
                cost="0" if hit else f"0.{rng.randrange(1, 99999):05d}123",
                saved=f"0.000{rng.randrange(1, 999):03d}" if hit else "0",
                latency=round(rng.uniform(5, 900), 2), cache="semantic-hit" if hit else "miss"))
        # outside the range: just before since, exactly at until (exclusive)
        rows.append(usage_row(tenant_id=tid, key_id=None, model="alpha", when=SINCE - timedelta(seconds=1),
                              prompt=1000, cached=0, completion=1000, cost="9", latency=1.0))
        rows.append(usage_row(tenant_id=tid, key_id=None, model="alpha", when=UNTIL, prompt=1000, cached=0,
                              completion=1000, cost="9", latency=1.0))
        # in range, no key (e.g. a key deleted later)
        rows.append(usage_row(tenant_id=tid, key_id=None, model="alpha", when=SINCE + timedelta(hours=1),
                              prompt=7, cached=0, completion=3, cost="0.00000100", latency=42.0))
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add_all(rows)
        await s.commit()
    in_range = [r for r in rows if SINCE <= r.created_at < UNTIL]
    return {"names": names, "tenants": tenants, "keys": keys, "rows": in_range}


def _expected(rows: list[UsageRecord], group) -> dict[str, dict]:
    out: dict[str, dict] = {}
    buckets: dict[str, list[UsageRecord]] = defaultdict(list)
    for r in rows:
        buckets[group(r)].append(r)
    for g, rs in buckets.items():
        out[g] = {
            "requests": len(rs), "prompt_tokens": sum(r.prompt_tokens for r in rs),
            "cached_prompt_tokens": sum(r.cached_prompt_tokens for r in rs),
            "completion_tokens": sum(r.completion_tokens for r in rs),
            "cost_usd": float(sum((r.cost_usd for r in rs), Decimal(0))),
            "saved_usd": float(sum((r.saved_usd for r in rs), Decimal(0))),
            "cache_hits": sum(r.cache in ("hit", "semantic-hit") for r in rs),
            "p50_latency_ms": _q([r.latency_ms for r in rs], 0.50),
            "p95_latency_ms": _q([r.latency_ms for r in rs], 0.95),
        }
    return out


def _check(row: dict, want: dict) -> None:
    for field, value in want.items():
        if field.endswith("_usd"):
            assert row[field] == pytest.approx(value, abs=1e-8), field
        elif field.endswith("_ms"):
            assert row[field] == pytest.approx(value, abs=1e-3), field
        else:
            assert row[field] == value, field
    assert row["total_tokens"] == row["prompt_tokens"] + row["completion_tokens"]


@pytest.mark.parametrize("group_by", ["day", "model", "key"])
async def test_report_groups_and_totals_equal_usage_rows(client, auth, seeded, group_by):
    name = seeded["names"][0]
    tid = seeded["tenants"][name]["id"]
    mine = [r for r in seeded["rows"] if r.tenant_id == tid]
    labels = {k["id"]: f"{k['prefix']} {k['name']}" if k["name"] else k["prefix"] for k in seeded["keys"][name]}
    group = {"day": lambda r: r.created_at.strftime("%Y-%m-%d"), "model": lambda r: r.model,
             "key": lambda r: labels.get(r.api_key_id, "(no key)")}[group_by]
    resp = await client.get(f"/admin/v1/tenants/{name}/report", headers=auth("admin:read"),
                            params={"since": SINCE.isoformat(), "until": UNTIL.isoformat(), "group_by": group_by})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["tenant"] == name and body["group_by"] == group_by
    want = _expected(mine, group)
    assert sorted(r["group"] for r in body["rows"]) == sorted(want)
    for row in body["rows"]:
        _check(row, want[row["group"]])
    _check(body["total"], _expected(mine, lambda r: "all")["all"])
    # the groups add up to the total
    for field in ("requests", "prompt_tokens", "completion_tokens", "cache_hits"):
        assert sum(r[field] for r in body["rows"]) == body["total"][field]
    if group_by == "day":
        assert [r["group"] for r in body["rows"]] == ["2026-03-01", "2026-03-02", "2026-03-03"]


async def test_report_csv_round_trip(client, auth, seeded):
    name = seeded["names"][1]
    params = {"since": "2026-03-01", "until": "2026-03-04T00:00:00Z", "group_by": "model"}
    reply = await client.get(f"/admin/v1/tenants/{name}/report", params=params, headers=auth())
    as_json = json.loads(reply.text, parse_float=Decimal)  # money as the exact numbers written
    resp = await client.get(f"/admin/v1/tenants/{name}/report", params={**params, "format": "csv"},
                            headers=auth())
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/csv")
    assert "attachment" in resp.headers["content-disposition"]
    parsed = list(csv.DictReader(io.StringIO(resp.text)))
    assert parsed[0].keys() >= {"model", "requests", "cost_usd", "p95_latency_ms"}
    assert [p["model"] for p in parsed] == [r["group"] for r in as_json["rows"]] + ["TOTAL"]
    back = reports.from_csv(resp.text)
    for got, want in zip(back, [*as_json["rows"], as_json["total"]], strict=True):
        for field, value in want.items():
            if field == "group":
                assert got["model"] == value
            elif field.endswith("_ms") and value is not None:
                assert got[field] == float(value), field
            else:
                assert got[field] == value, field
    # money is written with its 8 decimals, from the Decimal (not "0.444" or "0.0" from a float)
    for row in parsed:
        assert re.fullmatch(r"\d+\.\d{8}", row["cost_usd"]) and re.fullmatch(r"\d+\.\d{8}", row["saved_usd"]), row


async def test_summary_across_tenants(client, auth, app, seeded):
    resp = await client.get("/admin/v1/summary", params={"since": SINCE.isoformat(), "until": UNTIL.isoformat()},
                            headers=auth("admin:read"))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    by_name = {r["group"]: r for r in body["rows"]}
    for name in seeded["names"]:
        tid = seeded["tenants"][name]["id"]
        _check(by_name[name], _expected([r for r in seeded["rows"] if r.tenant_id == tid], lambda r: "x")["x"])
    async with app.state.admin_context.database.sessionmaker() as s:
        n, tokens = (await s.execute(select(func.count(UsageRecord.id), func.sum(UsageRecord.prompt_tokens))
                                     .where(UsageRecord.created_at >= SINCE, UsageRecord.created_at < UNTIL))).one()
    assert body["total"]["requests"] == n and body["total"]["prompt_tokens"] == tokens
    csv_text = (await client.get("/admin/v1/summary", params={"since": SINCE.isoformat(),
                                                               "until": UNTIL.isoformat(), "format": "csv"},
                                 headers=auth())).text
    assert {r["tenant"] for r in reports.from_csv(csv_text)} >= set(seeded["names"])


async def test_report_errors(client, auth, seeded):
    name = seeded["names"][0]
    resp = await client.get(f"/admin/v1/tenants/{name}/report", headers=auth(),
                            params={"since": UNTIL.isoformat(), "until": SINCE.isoformat()})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "since"
    resp = await client.get(f"/admin/v1/tenants/{name}/report", headers=auth(), params={"group_by": "week"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "group_by"
    assert (await client.get("/admin/v1/tenants/nobody/report", headers=auth())).status_code == 404
    empty = (await client.get(f"/admin/v1/tenants/{name}/report", headers=auth(),
                              params={"since": "2020-01-01", "until": "2020-02-01"})).json()
    assert empty["rows"] == [] and empty["total"]["requests"] == 0 and empty["total"]["p50_latency_ms"] is None


def test_percentile_matches_statistics():
    values = sorted(random.Random(3).uniform(0, 100) for _ in range(37))
    for q in (0.5, 0.95):
        assert reports.percentile(values, q) == pytest.approx(_q(values, q), abs=1e-3)
    assert reports.percentile([], 0.5) is None
    assert reports.percentile([4.0], 0.95) == 4.0


def test_parse_time_reads_iso_dates_and_refuses_bare_numbers():
    assert reports.parse_time("20261203") == reports.parse_time("2026-12-03") == datetime(2026, 12, 3)
    assert reports.parse_time("20261203T1230Z") == datetime(2026, 12, 3, 12, 30, tzinfo=UTC)
    for epoch in ("1764547200", "1764547200.5", "-5", "1e9", "20261345"):
        with pytest.raises(ValueError, match="not Unix seconds"):
            reports.parse_time(epoch)
    with pytest.raises(ValueError, match="not an ISO date or datetime"):
        reports.parse_time("yesterday")


async def test_api_and_cli_read_since_and_until_alike(client, auth, env, capsys):
    """``20261203`` is 2026-12-03 to the API as to the CLI (the API read it as Unix seconds:
    1970-08-23); a bare epoch number is a 400 / a usage error on both, naming the bound."""
    import asyncio

    from admin import cli

    name = unique("dates")
    await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
    url = f"/admin/v1/tenants/{name}/report"
    basic = (await client.get(url, params={"since": "20261203", "until": "20261205T12"}, headers=auth())).json()
    assert (basic["since"], basic["until"]) == ("2026-12-03T00:00:00+00:00", "2026-12-05T12:00:00+00:00")
    for param, value in (("since", "1764547200"), ("until", "1764547200"), ("since", "yesterday")):
        for path in (url, "/admin/v1/summary"):
            resp = await client.get(path, params={param: value}, headers=auth())
            error = resp.json()["error"]
            assert resp.status_code == 400 and error["param"] == param, resp.text
            assert error["message"].startswith(f"{param}: not ") and value in error["message"]

    code = await asyncio.to_thread(cli.main, ["report", "--tenant", name, "--since", "20261203", "--until",
                                              "20261205T12", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert (json.loads(out)["since"], json.loads(out)["until"]) == (basic["since"], basic["until"])
    with pytest.raises(SystemExit) as info:
        await asyncio.to_thread(cli.main, ["summary", "--since", "1764547200"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "argument --since" in err and "Unix seconds" in err


# 500 rows of this cost add up, as 64-bit floats one after the other, to 617283.94505999 rather than
# 617283.94506 (the drift that 630,000 real rows of small costs showed QA)
DRIFTING_COST, DRIFTING_ROWS = "1234.56789012", 500


def test_the_drifting_rows_do_drift_as_floats():
    total = 0.0
    for _ in range(DRIFTING_ROWS):
        total += float(DRIFTING_COST)
    assert f"{total:.8f}" != str(Decimal(DRIFTING_COST) * DRIFTING_ROWS)


async def test_money_sums_are_exact_on_every_database(client, app, auth):
    """Found by QA: on SQLite (NUMERIC kept as a float) a report's cost and savings were float sums,
    2482.56999999 for 2482.57 over 630,000 rows; money is now summed as integer 1e-8 USD units there
    (PostgreSQL's NUMERIC sums were exact already)."""
    name = unique("exact-sum")
    tid = (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).json()["id"]
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add_all([usage_row(tenant_id=tid, key_id=None, model="m", when=SINCE + timedelta(minutes=i), prompt=1,
                             cached=0, completion=1, cost=DRIFTING_COST, saved=DRIFTING_COST, latency=1.0)
                   for i in range(DRIFTING_ROWS)])
        await s.commit()
    exact = Decimal(DRIFTING_COST) * DRIFTING_ROWS
    resp = await client.get(f"/admin/v1/tenants/{name}/report", headers=auth(),
                            params={"since": SINCE.isoformat(), "until": UNTIL.isoformat()})
    report = json.loads(resp.text, parse_float=Decimal)
    assert (report["total"]["cost_usd"], report["total"]["saved_usd"]) == (exact, exact), resp.text
    assert [r["cost_usd"] for r in report["rows"]] == [exact]
    summary = json.loads((await client.get("/admin/v1/summary", headers=auth(), params={
        "since": SINCE.isoformat(), "until": UNTIL.isoformat()})).text, parse_float=Decimal)
    (row,) = [r for r in summary["rows"] if r["group"] == name]
    assert (row["cost_usd"], row["saved_usd"]) == (exact, exact)


async def test_a_bound_with_no_utc_equivalent_is_a_400_naming_it_and_a_cli_usage_error(client, auth, env, capsys):
    """Found by QA: ``since=0001-01-01T00:00+05:00`` (before year 1 in UTC) or
    ``until=9999-12-31T23:59-05:00`` (past year 9999) was a 400 with ``param: null`` where every
    other bad bound names ``since``/``until``, and ``pagegate admin report --since …`` exited 1 where
    every other bad ``--since`` is a usage error (exit 2)."""
    import asyncio

    from admin import cli

    name = unique("no-utc")
    await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
    for param, value in (("since", "0001-01-01T00:00+05:00"), ("until", "9999-12-31T23:59-05:00")):
        for path in (f"/admin/v1/tenants/{name}/report", "/admin/v1/summary"):
            resp = await client.get(path, params={param: value}, headers=auth())
            error = resp.json()["error"]
            assert resp.status_code == 400 and error["param"] == param, resp.text
            assert error["message"].startswith(f"{param}: ") and "no UTC equivalent" in error["message"]
        for argv in (["report", "--tenant", name, f"--{param}", value], ["summary", f"--{param}", value]):
            with pytest.raises(SystemExit) as info:
                await asyncio.to_thread(cli.main, argv)
            err = capsys.readouterr().err
            assert info.value.code == 2 and f"argument --{param}" in err and "no UTC equivalent" in err, err


def test_calendar_days_end_tomorrow_and_include_today():
    now = datetime(2026, 3, 31, 12, 30, tzinfo=UTC)
    assert reports.calendar_days(30, now) == (datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))
    assert reports.calendar_days(1, now) == (datetime(2026, 3, 31, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))


async def test_the_total_adds_up_while_usage_rows_are_written(client, app, auth):
    """Found by QA: TOTAL was a query of its own, run a statement after the grouped one; a usage row
    committed between them (gateways write all the time) was in TOTAL and in no line above it, so the
    CSV's last line did not add up (37 of ~650 reports under load on PostgreSQL, 19 of ~400 on SQLite)."""
    from gateway.db.models import Tenant

    name = unique("adds-up")
    tid = (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).json()["id"]
    sessionmaker = app.state.admin_context.database.sessionmaker

    def row(minute: int) -> UsageRecord:
        return usage_row(tenant_id=tid, key_id=None, model="m", when=SINCE + timedelta(minutes=minute), prompt=5,
                         cached=0, completion=7, cost="0.00000123", latency=10.0 + minute)

    async with sessionmaker() as s:
        s.add_all([row(1), row(2)])
        await s.commit()
    async with sessionmaker() as session:
        tenant = await session.get(Tenant, tid)
        execute, statements = session.execute, []

        async def execute_then_write(*args, **kwargs):
            result = await execute(*args, **kwargs)
            statements.append(args[0])
            if len(statements) == 1:  # a gateway's row lands between the report's statements
                async with sessionmaker() as other:
                    other.add(row(3))
                    await other.commit()
            return result

        session.execute = execute_then_write
        report = await reports.tenant_report(session, tenant=tenant, since=SINCE, until=UNTIL, group_by="day")
    assert len(statements) >= 2  # (else this test no longer tests a race)
    for field in ("requests", "prompt_tokens", "completion_tokens", "total_tokens", "cost_usd"):
        assert getattr(report.total, field) == sum(getattr(r, field) for r in report.rows), field
    assert report.total.requests == 2 and report.total.cost_usd == Decimal("0.00000246")


def test_parse_time_refuses_what_fromisoformat_would_read_wrong():
    """Found by QA: ``fromisoformat`` reads a fraction of the hour or minute (``T17.75``: 17:45 in
    ISO) as a fraction of a second, cuts a fraction past microseconds (moving an ``until`` earlier),
    and takes an offset's seconds and fraction; each is refused, naming the rule. Trailing zeros
    past the microsecond are exact and pass."""
    for value in ("2026-12-06T17.75Z", "2026-12-06T17:44.9Z", "2026-11-01T12:00:00.5+05:30:00.0000001",
                  "2026-11-01T12:00:00,000000-00:00:00.9999999", "2026-11-01T12:00:00.Z", "2026-11-01.1234567"):
        with pytest.raises(ValueError, match="a fraction only of the second"):
            reports.parse_time(value)
    for value in ("2026-11-30T23:59:59.9999999Z", "20261130T235959,0000001"):
        with pytest.raises(ValueError, match="too precise"):
            reports.parse_time(value)
    assert reports.parse_time("2026-11-30T23:59:59.9999990Z") == datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC)
    assert reports.parse_time("20261101T120000,123456Z") == datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert reports.parse_time("2026-11-01T12+05") == datetime(2026, 11, 1, 7, tzinfo=UTC)
    assert reports.parse_time("2026-11-01 12:00-0530") == datetime(2026, 11, 1, 17, 30, tzinfo=UTC)
