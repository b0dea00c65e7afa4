"""What each ``pagegate admin …`` command does. Every command opens the configured database
(upgrading the schema first) and, when ``PAGEGATE_REDIS_URL`` is set, Redis for invalidations.
Results go to stdout (tables; with ``--json`` one JSON document shaped as the admin API's reply; or a
bare key/token for scripts); notes and errors go to stderr."""

from __future__ import annotations

import argparse
import getpass
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

from redis.asyncio import Redis
from sqlalchemy.engine import make_url

from admin import reports
from admin.api.exact_json import dumps
from admin.auth import ALL_SCOPES, mint_token
from admin.checks import checked_new_tenant, checked_price
from admin.management import Management, price_view, tenant_view
from admin.tables import cell_text, decimal_text, format_record, format_table
from gateway.db.models import Tenant
from gateway.db.session import Database, safe_url
from gateway.redis_server import running_embedded_url
from gateway.settings import Settings


def note(message: str) -> None:
    print(message, file=sys.stderr)


@asynccontextmanager
async def management(settings: Settings, *, create: bool = True) -> AsyncIterator[Management]:
    """``create``: a SQLite file that does not exist yet is created (``tenants create`` before the
    first ``pagegate serve``, with a note saying so); else (every other command: it could only
    find nothing there) it is an error: a mistyped path must not leave an empty database behind."""
    path = _sqlite_path(settings.database_url)
    # an empty file (``touch``, a failed copy) is no database either: a read-only command must not
    # write a schema into it
    exists = path is not None and Path(path).exists()
    new = path is not None and (not exists or Path(path).stat().st_size == 0)
    if new and not create:
        what = "an empty file, not a database," if exists else "no database"
        raise NoDatabase(f"{what} at {path} (PAGEGATE_DATABASE_URL={safe_url(settings.database_url)}): "
                         "check the path, or create a tenant or start `pagegate serve`, which create it")
    db = Database(settings.database_url)
    if path is not None:
        sqlite3.connect(path).close()  # an unusable path fails here with a plain sqlite3.Error (see below)
    if new:
        note(f"note: created a new database at {path}")
    await db.upgrade()
    redis_url = settings.redis_url or running_embedded_url(settings.data_dir)  # (`make run`'s own)
    redis = Redis.from_url(redis_url) if redis_url else None
    try:
        async with db.sessionmaker() as session:
            yield Management(session=session, actor=f"cli:{_user()}", redis=redis,
                             redis_prefix=settings.redis_prefix)
    finally:
        if redis is not None:
            await redis.aclose()
        await db.dispose()


class NoDatabase(ValueError):
    """A command other than ``CREATES_DATABASE``'s, pointed at a SQLite file that does not exist."""


def _sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL (None: another database, or in memory). ``management`` opens it
    once, synchronously, so an unusable path fails there with a plain ``sqlite3.Error`` rather
    than inside the migration's own event loop (whose driver thread would then print a traceback
    while the loop closes)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        return parsed.database
    return None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _print_json(value: object) -> None:
    """``value`` as the API writes it: money as exact JSON numbers, one document on one line."""
    print(dumps(value))


def _warn_no_redis(ops: Management) -> None:
    if ops.redis is None:
        note("note: PAGEGATE_REDIS_URL is unset and no embedded Redis runs on this data directory; running "
             "gateways see this change when their key cache expires (PAGEGATE_KEY_CACHE_TTL_S) instead of within a second.")


TENANT_COLUMNS = ("name", "enabled", "rpm", "tpm", "budget_tokens", "budget_usd", "period", "cache_enabled")
KEY_COLUMNS = ("id", "tenant", "prefix", "name", "allowed_models", "rpm", "revoked", "created_at")


def _table_view(view: dict, *, tenant: bool = True) -> dict:
    """A row for a table (not ``--json``): a limit of 0 reads ``unlimited`` and a tenant's unset one
    ``default`` (the server's), as the dashboard shows them; a budget of 0 stays 0 (it refuses all)."""
    out = dict(view)
    for field in ("rpm", "tpm") if tenant else ("rpm",):
        if field not in out:
            continue
        value = out[field]
        if value == 0:
            out[field] = "unlimited"
        elif value is None and tenant:
            out[field] = "default"
    return out
REPORT_COLUMNS = ("requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "total_tokens",
                  "cost_usd", "cache_hits", "saved_usd", "p50_latency_ms", "p95_latency_ms")


class _Cleared:
    """An option of ``tenants update`` given as ``default`` (``--rpm default``) or ``none``
    (``--budget-usd none``): the setting goes back to null, as the API's ``null`` does."""

    def __repr__(self) -> str:
        return "CLEARED"


CLEARED = _Cleared()


def _limits(args: argparse.Namespace) -> dict:
    """Tenant fields given on the command line (only those given; ``CLEARED`` ones as None)."""
    out = {}
    for attr in ("rpm", "tpm", "budget_tokens", "budget_usd", "period", "cache_threshold", "cache_ttl_s",
                 "cache_max_entries"):
        value = getattr(args, attr, None)
        if value is not None:
            out[attr] = None if value is CLEARED else value
    if getattr(args, "cache", None) is not None:
        out["cache_enabled"] = args.cache == "on"
    if getattr(args, "no_budget", False):
        out["budget_tokens"] = out["budget_usd"] = None
    return out


async def tenants_create(ops: Management, args: argparse.Namespace) -> int:
    tenant = await ops.create_tenant(name=args.name, **_limits(args))
    note(f"created tenant {tenant.name} (id {tenant.id})")
    print(format_table(TENANT_COLUMNS, [[_table_view(tenant_view(tenant))[c] for c in TENANT_COLUMNS]]))
    return 0


async def tenants_list(ops: Management, args: argparse.Namespace) -> int:
    if args.json:  # GET /tenants with every tenant on one page (by id)
        _print_json((await ops.tenant_page(limit=None)).as_dict())
        return 0
    views = [_table_view(tenant_view(t)) for t in await ops.tenants()]
    print(format_table(("id", *TENANT_COLUMNS), [[v["id"], *(v[c] for c in TENANT_COLUMNS)] for v in views]))
    return 0


async def tenants_show(ops: Management, args: argparse.Namespace) -> int:
    tenant = await ops.tenant(args.name)
    view = tenant_view(tenant)
    budget = await ops.budget(tenant)
    keys = await ops.key_page(tenant=tenant, limit=None)
    if args.json:  # GET /tenants/{name}, with /budget and every key of /keys inside
        _print_json({**view, "budget": budget, "keys": keys.as_dict()})
        return 0
    print(format_record([*_table_view(view).items(), ("spent_tokens", budget["spent_tokens"]),
                         ("spent_usd", budget["spent_usd"]), ("period_start", budget["period_start"])]))
    print()
    print(format_table(KEY_COLUMNS, [[_table_view(k, tenant=False)[c] for c in KEY_COLUMNS] for k in keys.data])
          if keys.data else "(no keys)")
    return 0


async def tenants_update(ops: Management, args: argparse.Namespace) -> int:
    changes = _limits(args)
    if not changes:
        note("error: nothing to change (give --rpm, --tpm, --budget-tokens, --budget-usd, --period, --cache, ...)")
        return 2
    tenant, changed = await ops.apply_tenant_update(args.name, **changes)
    if not changed:  # no audit row, nothing pushed: "updated" would be a false record
        note(f"tenant {tenant.name} unchanged: it already has those settings")
        return 0
    _warn_no_redis(ops)
    shown = _table_view(changed)  # rpm/tpm as the tables show them: unlimited, default
    note(f"updated tenant {tenant.name}: " + ", ".join(f"{k}={_shown(v)}" for k, v in shown.items()))
    return 0


def _shown(value: object) -> str:
    """A changed setting as the tables show it (``-`` for a cleared one, ``1,000.00``), a flag as
    ``on``/``off``."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return cell_text(value)


async def tenants_enable(ops: Management, args: argparse.Namespace) -> int:
    enabled = args.tenants_cmd == "enable"
    state = "enabled" if enabled else "disabled"
    tenant, changed = await ops.apply_enabled(args.name, enabled)
    if not changed:
        note(f"tenant {tenant.name} unchanged: it is already {state}")
        return 0
    _warn_no_redis(ops)
    note(f"{state} tenant {tenant.name}")
    return 0


async def tenants_clear_cache(ops: Management, args: argparse.Namespace) -> int:
    tenant, entries, gone = await ops.clear_cache(args.name)
    note(f"cleared the semantic cache of tenant {tenant.name}: {entries} stored answer(s) removed "
         f"({gone} Redis key(s) in all)")
    return 0


async def tenants_delete(ops: Management, args: argparse.Namespace) -> int:
    tenant, revoked = await ops.delete_tenant(args.name)
    note(f"deleted tenant {tenant.name} ({revoked} key(s) revoked; its usage stays in reports)")
    _warn_no_redis(ops)
    return 0


async def keys_create(ops: Management, args: argparse.Namespace) -> int:
    row, new = await ops.create_key(tenant=args.tenant, name=args.name, allowed_models=args.models, rpm=args.rpm)
    note(f"created key {row.prefix}… (id {row.id}) for tenant {args.tenant}; it is shown only once:")
    print(new.key)
    unserved, served = getattr(args, "unserved_models", ((), ()))
    if unserved:  # a typo (found by QA: --models SMOLLM2-135M-INSTRUCT made a key refused on every model)
        named = (f"no model named {unserved[0]!r}" if len(unserved) == 1
                 else f"none of the models {', '.join(repr(m) for m in unserved)}")
        note(f"warning: this configuration serves {named} (it serves "
             f"{', '.join(repr(m) for m in sorted(served))}); the key is refused (403) on every model it does not list")
    return 0


async def keys_list(ops: Management, args: argparse.Namespace) -> int:
    owner = await ops.tenant(args.tenant, include_deleted=True) if args.tenant else None
    if owner is not None:
        _note_if_deleted(owner)
    page = await ops.key_page(tenant=owner, prefix=args.prefix, include_revoked=not args.active, limit=None)
    if args.json:
        _print_json(page.as_dict())
        return 0
    print(format_table(KEY_COLUMNS, [[_table_view(k, tenant=False)[c] for c in KEY_COLUMNS] for k in page.data]))
    return 0


def _note_if_deleted(tenant: Tenant) -> None:
    if tenant.deleted_at is not None:
        note(f"note: tenant {tenant.name} was deleted at {cell_text(tenant_view(tenant)['deleted_at'])} UTC")


async def keys_revoke(ops: Management, args: argparse.Namespace) -> int:
    row, changed = await ops.apply_revoke(args.key)
    if not changed:
        note(f"key {row.prefix} (id {row.id}) unchanged: it was already revoked")
        return 0
    _warn_no_redis(ops)
    note(f"revoked key {row.prefix} (id {row.id})")
    return 0


async def keys_rotate(ops: Management, args: argparse.Namespace) -> int:
    old, row, new = await ops.rotate_key(args.key)
    _warn_no_redis(ops)
    note(f"revoked {old.prefix} (id {old.id}); its replacement {row.prefix} (id {row.id}) is shown only once:")
    print(new.key)
    return 0


async def prices_set(ops: Management, args: argparse.Namespace) -> int:
    row, changed = await ops.apply_price(model=args.model, prompt_usd_per_1m=args.prompt,
                                         completion_usd_per_1m=args.completion,
                                         cached_prompt_usd_per_1m=getattr(args, "cached_prompt", None))
    cached = ("" if row.cached_prompt_usd_per_1m is None
              else f", ${decimal_text(row.cached_prompt_usd_per_1m)} cached prompt")
    note(f"price of {row.model}{'' if changed else ' unchanged'}: ${decimal_text(row.prompt_usd_per_1m)} prompt, "
         f"${decimal_text(row.completion_usd_per_1m)} completion{cached} per 1M")
    served = getattr(args, "served_models", ())
    if served and row.model not in served:  # a typo would leave the real model billed at $0 (found by QA)
        note(f"warning: this configuration serves no model named {row.model!r} (it serves "
             f"{', '.join(repr(m) for m in sorted(served))}); usage rows are priced by the exact model name")
    return 0


async def prices_delete(ops: Management, args: argparse.Namespace) -> int:
    row = await ops.delete_price(args.model)
    note(f"deleted the price of {row.model}: it now costs 0 (rows already billed keep their cost)")
    return 0


async def prices_list(ops: Management, args: argparse.Namespace) -> int:
    views = [price_view(p) for p in await ops.prices()]
    if args.json:
        _print_json({"object": "list", "data": views})
        return 0
    cols = ("model", "prompt_usd_per_1m", "completion_usd_per_1m", "cached_prompt_usd_per_1m", "updated_at")
    print(format_table(cols, [[v[c] for c in cols] for v in views]))
    return 0


def _print_report(report: reports.Report, args: argparse.Namespace, first: str) -> None:
    if args.csv:
        sys.stdout.write(reports.to_csv(report))
        return
    if args.json:
        _print_json(report.as_dict())
        return
    note(f"{_instant(report.since)} .. {_instant(report.until)} UTC")
    rows = [r.as_dict() for r in [*report.rows, report.total]]
    print(format_table((first, *REPORT_COLUMNS), [[r["group"], *(r[c] for c in REPORT_COLUMNS)] for r in rows]))


def _instant(when: datetime) -> str:
    """A UTC range bound to the second (found by QA: to the minute, a range within one minute read
    ``21:30 .. 21:30``), its year in 4 digits (``%Y`` writes year 1 as ``1``); a bound with a
    fraction of a second keeps it (found by QA: 23:59:59.999999 read 23:59:59)."""
    return when.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds" if when.microsecond else "seconds")


def _report_range(args: argparse.Namespace) -> tuple[datetime, datetime] | None:
    """``--since``/``--until`` with their defaults; None (after saying why) when backwards, as the API refuses."""
    since, until = reports.default_range(args.since, args.until)
    if since >= until:  # named by the bound that was sent, as the API's param (found by QA)
        if args.since is None:
            note(f"error: --until ({_instant(until)}) must be after --since ({_instant(since)}, its default) UTC")
        else:
            note(f"error: --since ({_instant(since)}) must be before --until ({_instant(until)}"
                 f"{', its default: now' if args.until is None else ''}) UTC")
        return None
    return since, until


async def report(ops: Management, args: argparse.Namespace) -> int:
    if (span := _report_range(args)) is None:
        return 2
    since, until = span
    tenant = await ops.tenant(args.tenant, include_deleted=True)  # a deleted tenant's usage is still billed
    _note_if_deleted(tenant)
    result = await reports.tenant_report(ops.session, tenant=tenant, since=since, until=until, group_by=args.group_by)
    _print_report(result, args, args.group_by)
    return 0


async def summary(ops: Management, args: argparse.Namespace) -> int:
    if (span := _report_range(args)) is None:
        return 2
    since, until = span
    _print_report(await reports.summary(ops.session, since=since, until=until), args, "tenant")
    return 0


async def audit(ops: Management, args: argparse.Namespace) -> int:
    page = await ops.audit_page(target=args.target, action=args.action, limit=args.limit, after=args.before)
    if args.json:  # GET /audit?after=<--before>: has_more and last_id tell a script where to go on
        _print_json(page.as_dict())
        return 0
    cols = ("id", "created_at", "actor", "action", "target")
    print(format_table(cols, [[e[c] for c in cols] for e in page.data]))
    if page.has_more:
        note(f"older entries follow: --before {page.data[-1]['id']}")
    return 0


def token(settings: Settings, args: argparse.Namespace) -> int:
    scopes = [s for group in (args.scope or [list(ALL_SCOPES)]) for s in group]
    if settings.placeholder_admin_secret:
        note("warning: PAGEGATE_ADMIN_JWT_SECRET is the built-in default: only a server in dev mode (make run, "
             "--dev) takes this token; set your own secret on both sides")
    print(mint_token(settings, subject=args.sub, scopes=scopes, ttl_s=args.ttl))
    return 0


def parse_time(value: str) -> datetime:
    """``--since``/``--until``, read as the API reads them (``reports.parse_time``)."""
    try:
        return reports.parse_time(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _check_tenant(dialect: str, args: argparse.Namespace) -> None:
    checked_new_tenant(dialect, name=args.name, **_limits(args))


def _check_price(dialect: str, args: argparse.Namespace) -> None:
    checked_price(dialect, model=args.model, prompt_usd_per_1m=args.prompt, completion_usd_per_1m=args.completion,
                  cached_prompt_usd_per_1m=getattr(args, "cached_prompt", None))


# the commands that can succeed on a new, empty database: only they create a missing SQLite file,
# and only after their values pass the checks that need no database (a refusal leaves no file behind)
CREATES_DATABASE = {tenants_create: _check_tenant, prices_set: _check_price}


def check_first(settings: Settings, args: argparse.Namespace) -> None:
    """Refuse (``InvalidField``) a ``CREATES_DATABASE`` command's bad value before any database is made."""
    CREATES_DATABASE[args.run](make_url(settings.database_url).get_backend_name(), args)
