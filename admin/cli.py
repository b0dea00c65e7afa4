"""``pagegate admin …``: tenants, keys, prices, reports, the audit log and admin tokens, straight
against the configured database (``PAGEGATE_DATABASE_URL``) and Redis (``PAGEGATE_REDIS_URL``).
This file only builds the parser; ``admin.cli_commands`` does the work."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sqlite3
import sys
from decimal import Decimal

from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from admin import cli_commands as cmd
from admin.auth import ALL_SCOPES, MAX_SUBJECT_CHARS, MAX_TOKEN_TTL_S
from admin.management import Conflict, NotFound, priced_model
from admin.schemas import INT32_MAX, INT64_MAX, PLAIN_DECIMAL, WHOLE_NUMBER, InvalidField, split_models
from gateway.db.session import safe_url
from gateway.errors import ApiError
from gateway.serve import safe_redis_url
from gateway.settings import Settings, miscased_refusal
from gateway.tenancy import TenancyError


def _usd(value: str) -> Decimal:
    # plain decimal notation only, as the API reads money strings: Decimal() also takes "1_000", " 5",
    # "+5", "1e3", "nan", and "-0" (a negative zero, which passes ">= 0")
    if not PLAIN_DECIMAL.fullmatch(value):
        raise argparse.ArgumentTypeError(f"not an amount: {value!r} (digits and at most one point, no sign)")
    amount = Decimal(value)
    if amount >= 10 ** 10:
        raise argparse.ArgumentTypeError(f"at most 10 digits before the point: {value!r}")
    if amount != amount.quantize(Decimal("1e-8")):  # the money columns' scale (0.100000000 is fine)
        raise argparse.ArgumentTypeError(f"at most 8 decimals: {value!r}")
    return amount


def _counter(limit: int | None):  # noqa: ANN202
    def count(value: str) -> int:
        if not WHOLE_NUMBER.fullmatch(value):  # int() also takes "1_000", " 5", "+5" and "٣"
            raise argparse.ArgumentTypeError(f"not a whole number: {value!r} (plain digits 0-9)")
        n = int(value)
        if n < 0:
            raise argparse.ArgumentTypeError("must be >= 0")
        if limit is not None and n > limit:
            raise argparse.ArgumentTypeError(f"must be <= {limit:,}")
        return n

    return count


_count = _counter(INT32_MAX)  # rates, key limits
_tokens = _counter(INT64_MAX)  # token budgets
_whole = _counter(None)  # checked by its caller


def _positive(value: str) -> int:
    n = _whole(value) if not value.startswith("-") else -1
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a whole number > 0, not {value!r}")
    return n


def _threshold(value: str) -> float:
    """A similarity threshold in (0, 1], in plain decimal notation as money is."""
    if not PLAIN_DECIMAL.fullmatch(value):  # float() also takes "0.9_5", " 1", "nan", "1e-1"
        raise argparse.ArgumentTypeError(f"not a number: {value!r} (digits and at most one point, no sign)")
    x = float(value)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], not {value!r}")
    return x


def _row_id(value: str) -> int:
    """An id (``--before``), a row count (``--limit``) or a positive tenant setting
    (``--cache-ttl-s``, ``--cache-max-entries``): at most the columns' range."""
    n = _positive(value)
    if n > INT32_MAX:
        raise argparse.ArgumentTypeError(f"at most {INT32_MAX}, not {value!r}")
    return n


def _models(value: str) -> list[str]:
    try:
        return split_models(value)
    except InvalidField as exc:
        raise argparse.ArgumentTypeError(f"comma-separated model names, none empty (leave --models out for all "
                                         f"models), not {value!r}") from exc


def _scopes(value: str) -> list[str]:
    scopes = value.replace(",", " ").split()
    if not scopes or set(scopes) - set(ALL_SCOPES):
        raise argparse.ArgumentTypeError(f"{' and/or '.join(ALL_SCOPES)}, not {value!r}")
    return scopes


def _ttl(value: str) -> int:
    ttl = _positive(value)
    if ttl > MAX_TOKEN_TTL_S:
        raise argparse.ArgumentTypeError(f"at most {MAX_TOKEN_TTL_S} seconds (one year), not {value!r}")
    return ttl


def _subject(value: str) -> str:
    # the server refuses these subjects (found by QA: a line break or 257 characters exited 1, not as
    # the usage error an empty one is)
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    if len(value) > MAX_SUBJECT_CHARS or not value.isprintable():
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SUBJECT_CHARS} printable characters (no line breaks)")
    return value


def _or_word(word: str, parse):  # noqa: ANN001, ANN202
    """``parse``, or ``word`` for ``cmd.CLEARED``: the setting back to null, as the API's ``null``."""
    def value(text: str) -> object:
        if text.strip().lower() == word:
            return cmd.CLEARED
        try:
            return parse(text)
        except argparse.ArgumentTypeError as exc:  # (found by QA: `--rpm none` did not say what would do)
            raise argparse.ArgumentTypeError(f"{exc}, or {word!r}") from exc

    return value


def _limit_options(p: argparse.ArgumentParser, *, update: bool) -> None:
    """The tenant settings of ``create`` and ``update``. On ``update`` an option left out keeps its
    value; ``default`` resets a limit or cache setting to the server's, ``none`` removes one budget."""
    def clearable(word: str, parse):  # noqa: ANN001, ANN202
        return _or_word(word, parse) if update else parse

    kept = "left out: unchanged" if update else "left out: the server default"
    reset = '"default": the server default again; ' if update else ""
    cache_reset = f" ({reset}{kept})" if update else ""
    budget_reset = ' ("none": remove it; left out: unchanged)' if update else ""
    p.add_argument("--rpm", type=clearable("default", _count),
                   help=f"requests per minute (0: unlimited; {reset}{kept})")
    p.add_argument("--tpm", type=clearable("default", _count),
                   help=f"tokens per minute (0: unlimited; {reset}{kept})")
    p.add_argument("--budget-tokens", type=clearable("none", _tokens),
                   help=f"token budget per period, may be given with --budget-usd{budget_reset}")
    p.add_argument("--budget-usd", type=clearable("none", _usd), help=f"money budget (USD) per period{budget_reset}")
    if update:
        p.add_argument("--no-budget", action="store_true", help="remove both budgets")
    p.add_argument("--period", choices=("day", "month"), default=None if update else "month",
                   help="budget period (default: unchanged)" if update else "budget period (default: month)")
    p.add_argument("--cache", choices=("on", "off"), help="semantic cache for this tenant")
    p.add_argument("--cache-threshold", type=clearable("default", _threshold),
                   help=f"semantic-cache similarity threshold (0..1]{cache_reset}")
    p.add_argument("--cache-ttl-s", type=clearable("default", _row_id),
                   help=f"semantic-cache entry lifetime in seconds{cache_reset}")
    p.add_argument("--cache-max-entries", type=clearable("default", _row_id),
                   help=f"semantic-cache entries kept for this tenant{cache_reset}")


def _json_option(p: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
    p.add_argument("--json", action="store_true", help="one JSON document on stdout, as the admin API sends it")


def _range_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", type=cmd.parse_time, help="start (UTC, inclusive; default: 30 days ago)")
    p.add_argument("--until", type=cmd.parse_time, help="end (UTC, exclusive; default: now)")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--csv", action="store_true", help="CSV on stdout instead of a table")
    _json_option(output)


def register(subparsers: argparse._SubParsersAction) -> None:
    admin = subparsers.add_parser("admin", help="manage tenants, keys, prices; cost reports; admin tokens")
    sub = admin.add_subparsers(dest="admin_cmd", required=True, metavar="COMMAND")

    tenants = sub.add_parser("tenants", help="create, list, show, update, disable, enable, delete tenants; clear-cache")
    tsub = tenants.add_subparsers(dest="tenants_cmd", required=True, metavar="COMMAND")
    p = tsub.add_parser("create", help="add a tenant")
    p.add_argument("name")
    _limit_options(p, update=False)
    p.set_defaults(run=cmd.tenants_create)
    p = tsub.add_parser("list", help="all tenants")
    _json_option(p)
    p.set_defaults(run=cmd.tenants_list)
    p = tsub.add_parser("show", help="one tenant, its budget use and keys")
    p.add_argument("name")
    _json_option(p)
    p.set_defaults(run=cmd.tenants_show)
    p = tsub.add_parser("update", help="change limits, budget or cache settings")
    p.add_argument("name")
    _limit_options(p, update=True)
    p.set_defaults(run=cmd.tenants_update)
    for verb in ("disable", "enable"):
        p = tsub.add_parser(verb, help=f"{verb} a tenant (every gateway within 1 s with Redis)")
        p.add_argument("name")
        p.set_defaults(run=cmd.tenants_enable)
    p = tsub.add_parser("clear-cache", help="drop a tenant's semantic-cache entries now (needs Redis)")
    p.add_argument("name")
    p.set_defaults(run=cmd.tenants_clear_cache)
    p = tsub.add_parser("delete", help="revoke a tenant's keys and delete it (its usage history stays)")
    p.add_argument("name")
    p.add_argument("--yes", action="store_true", required=True, help="required: deleting cannot be undone")
    p.set_defaults(run=cmd.tenants_delete)

    keys = sub.add_parser("keys", help="create, list, revoke, rotate API keys")
    ksub = keys.add_subparsers(dest="keys_cmd", required=True, metavar="COMMAND")
    p = ksub.add_parser("create", help="mint a key; prints it alone on stdout (shown once)")
    p.add_argument("--tenant", required=True, help="the tenant's name")
    p.add_argument("--name", help="a label for the key (shown in lists and reports)")
    p.add_argument("--models", type=_models, help="comma-separated allowed models (default: all)")
    p.add_argument("--rpm", type=_count, help="per-key requests per minute")
    p.set_defaults(run=cmd.keys_create)
    p = ksub.add_parser("list", help="keys (never the keys themselves: prefixes)")
    p.add_argument("--tenant")
    p.add_argument("--prefix", help="display prefix, e.g. pg-AbC1234")
    p.add_argument("--active", action="store_true", help="hide revoked keys")
    _json_option(p)
    p.set_defaults(run=cmd.keys_list)
    for verb, fn, text in (("revoke", cmd.keys_revoke, "revoke a key"),
                           ("rotate", cmd.keys_rotate, "revoke a key and print its replacement")):
        p = ksub.add_parser(verb, help=text)
        p.add_argument("key", help="key id or display prefix")
        p.set_defaults(run=fn)

    prices = sub.add_parser("prices", help="model prices (USD per 1M tokens)")
    psub = prices.add_subparsers(dest="prices_cmd", required=True, metavar="COMMAND")
    p = psub.add_parser("set", help="set a model's price")
    p.add_argument("model")
    p.add_argument("--prompt", type=_usd, required=True, help="USD per 1M prompt tokens")
    p.add_argument("--completion", type=_usd, required=True, help="USD per 1M completion tokens")
    p.add_argument("--cached-prompt", type=_usd, default=None,
                   help="USD per 1M prompt tokens served from the prefix cache (left out: the prompt's price)")
    p.set_defaults(run=cmd.prices_set)
    p = psub.add_parser("list", help="all prices")
    _json_option(p)
    p.set_defaults(run=cmd.prices_list)
    p = psub.add_parser("delete", help="remove a model's price (the model then costs 0)")
    p.add_argument("model")
    p.set_defaults(run=cmd.prices_delete)

    p = sub.add_parser("report", help="one tenant's usage and cost")
    p.add_argument("--tenant", required=True)
    p.add_argument("--group-by", choices=("day", "model", "key"), default="day")
    _range_options(p)
    p.set_defaults(run=cmd.report)
    p = sub.add_parser("summary", help="usage and cost of every tenant")
    _range_options(p)
    p.set_defaults(run=cmd.summary)
    p = sub.add_parser("audit", help="recent admin changes, newest first")
    p.add_argument("--target", help="e.g. tenant:acme or key:pg-AbC1234")
    p.add_argument("--action", help="e.g. key.revoke")
    p.add_argument("--limit", type=_row_id, default=50,
                   help="entries shown (default: 50; unlike the API, past 1000 too)")
    p.add_argument("--before", type=_row_id, metavar="ID",
                   help="only entries older than entry ID (the next page: the last id shown)")
    _json_option(p)
    p.set_defaults(run=cmd.audit)

    p = sub.add_parser("token", help="mint an HS256 admin token (PAGEGATE_ADMIN_JWT_SECRET)")
    p.add_argument("--scope", type=_scopes, action="append", help="admin:read and/or admin:write (default: both)")
    p.add_argument("--ttl", type=_ttl, default=None,
                   help=f"lifetime in seconds, at most {MAX_TOKEN_TTL_S} (default: PAGEGATE_ADMIN_TOKEN_TTL_S, 3600)")
    p.add_argument("--sub", type=_subject, default="admin", help="subject recorded in the audit log (default: admin)")
    p.set_defaults(run=None)

    admin.set_defaults(func=run)


def run(args: argparse.Namespace, settings: Settings | None = None) -> int:
    """Entry point for ``pagegate admin``; returns the exit status (1 on a refused change)."""
    miscased = miscased_refusal() if settings is None else None
    if miscased is not None:  # (found by QA: `serve` refused them, the CLI used them without a word)
        cmd.note(f"error: {miscased}")
        return 1
    try:
        settings = settings or Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        cmd.note(f"error: bad setting PAGEGATE_{str(first['loc'][0]).upper()}: {first['msg'].removeprefix('Value error, ')}")
        return 1
    # the CLI prints its own warning when a Redis invalidation fails; the service log line would repeat it
    logging.getLogger("pagegate.admin").setLevel(logging.ERROR)
    undecodable = _undecodable(args)
    if undecodable is not None:  # (found by QA: a lookup by such a name blamed the database, or printed a codec error)
        cmd.note(f"error: {undecodable} is not valid UTF-8 text (bytes the terminal's encoding cannot read)")
        return 2
    if getattr(args, "no_budget", False) and (args.budget_tokens is not None or args.budget_usd is not None):
        cmd.note("error: --no-budget removes both budgets: not with --budget-tokens or --budget-usd")
        return 2  # a usage error, before any database is opened
    if getattr(args, "run", None) is cmd.keys_create and args.models:
        args.unserved_models = unserved_models(settings, args.models)
    if getattr(args, "run", None) in (cmd.prices_set, cmd.prices_delete):
        args.served_models = served_models(settings)
        args.model = priced_model(settings, args.model)  # (an alias of the embedding model: its served id)
    try:
        if args.admin_cmd == "token":
            return cmd.token(settings, args)
        return asyncio.run(_run_async(settings, args))
    except (NotFound, Conflict, TenancyError, ValueError) as exc:
        cmd.note(f"error: {exc}")
        return 1
    except ApiError as exc:  # (an operation that needs Redis, without it: clear-cache)
        cmd.note(f"error: {exc.message}")
        return 1
    except BrokenPipeError:  # `... | head`: the reader has what it wanted; no error, no flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (OSError, SQLAlchemyError, sqlite3.Error) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        cmd.note(f"error: cannot use the database at {safe_url(settings.database_url)}: {reason}")
        return 1


def _undecodable(args: argparse.Namespace) -> str | None:
    """The first argument holding bytes that are not UTF-8 (Python hands them over as lone
    surrogates), named as on the command line; None when there is none."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, str):
                try:
                    item.encode()
                except UnicodeEncodeError:
                    positional = name in _POSITIONAL and not (name == "name" and args.admin_cmd == "keys")
                    return name if positional else f"--{name.replace('_', '-')}"  # (keys create has --name)
    return None


_POSITIONAL = frozenset({"name", "key", "model"})


def served_models(settings: Settings) -> frozenset[str]:
    """The model ids a gateway with these settings answers to (the chat model, the embedding model)."""
    from engine.weights import served_name

    return frozenset({settings.served_model_name or served_name(settings.model), settings.embedding_model})


def unserved_models(settings: Settings, models: list[str]) -> tuple[list[str], frozenset[str]]:
    """Of a new key's ``--models``, those this configuration serves under no name (a chat model id
    matches exactly, the embedding model also by its aliases in any case), and the served ids."""
    from gateway.embedding_service import is_embedding_model

    served = served_models(settings)
    return [m for m in models if m not in served and not is_embedding_model(settings, m)], served


async def _run_async(settings: Settings, args: argparse.Namespace) -> int:
    creates = args.run in cmd.CREATES_DATABASE
    if creates:
        cmd.check_first(settings, args)
    async with cmd.management(settings, create=creates) as ops:
        code = await args.run(ops, args)
        if ops.invalidation_failed:
            cmd.note("warning: saved, but Redis was unreachable: gateways see the change when their key "
                     "cache expires (PAGEGATE_KEY_CACHE_TTL_S)")
        elif ops.invalidation_unheard:  # (found by QA: a CLI on another prefix said nothing, keys lived 30 s)
            where = safe_redis_url(settings.redis_url) if settings.redis_url else "the embedded Redis"
            cmd.note(f"warning: saved, but no gateway process heard the change ({where}, PAGEGATE_REDIS_PREFIX="
                     f"{settings.redis_prefix!r}): running gateways on another Redis or prefix see it when their "
                     "key cache expires (PAGEGATE_KEY_CACHE_TTL_S)")
        if ops.counter_kept:
            cmd.note("warning: the budget period changed, but without Redis its spend counter could not be "
                     "reset: if the tenant was on this period earlier in it, its budget counts too little "
                     "until the period ends (set PAGEGATE_REDIS_URL to the gateways' Redis)")
        if ops.cache_kept:  # (found by QA: the CLI said nothing of it; the server's log did)
            cmd.note("warning: its semantic-cache entries could not be purged without Redis: they are unreadable "
                     "(no key of the tenant is left) and expire at their TTL")
        return code


def main(argv: list[str] | None = None) -> int:
    """``python -m admin.cli …`` (same as ``pagegate admin …``)."""
    from gateway.cli import OneLineParser

    parser = OneLineParser(prog="pagegate")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["admin", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
