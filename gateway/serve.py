"""``pagegate serve [--host H] [--port P] [--dev] [--workers N]``: the gateway under uvicorn (with
``--workers`` above 1, N worker processes in front of one engine process: ``gateway.workers``).

Before serving: start an embedded Redis when ``PAGEGATE_REDIS_URL`` is unset, upgrade the
database schema (``alembic upgrade head``), and in dev mode (``make run``) on an empty database
create a ``default`` tenant and print one API key with a curl and an OpenAI-SDK example.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import signal
import sys

from gateway.settings import Settings

log = logging.getLogger("pagegate.serve")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible gateway",
                              description="Run the gateway (defaults from PAGEGATE_* settings).")
    p.add_argument("--host", help="bind address (default: PAGEGATE_HOST, else 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: PAGEGATE_PORT, else 8000)")
    p.add_argument("--dev", action="store_true",
                   help="development mode: on an empty database create a 'default' tenant and print a key")
    p.add_argument("--workers", type=int,
                   help="HTTP worker processes in front of one engine process (default: PAGEGATE_WORKERS, else 1: "
                        "one process serves everything)")
    p.set_defaults(func=run)


def served_model_id(settings: Settings) -> str:
    if settings.served_model_name:
        return settings.served_model_name
    from engine.weights import served_name

    return served_name(settings.model)


async def bootstrap_dev(settings: Settings) -> str | None:
    """On a database without tenants: create tenant ``default`` and one key; returns the key."""
    from sqlalchemy import func, select

    from gateway import tenancy
    from gateway.db.models import Tenant
    from gateway.db.session import Database

    db = Database(settings.database_url)
    try:
        async with db.sessionmaker() as session:
            if (await session.execute(select(func.count()).select_from(Tenant))).scalar_one():
                return None
            tenant = await tenancy.create_tenant(session, name="default")
            _row, new = await tenancy.create_api_key(session, tenant_id=tenant.id, name="dev")
            await session.commit()
            return new.key
    finally:
        await db.dispose()


def dev_banner(settings: Settings, key: str) -> str:
    base = f"http://{settings.host}:{settings.port}/v1"
    model = served_model_id(settings)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello in French."}],
                       "max_tokens": 32})
    sdk = (f'from openai import OpenAI\n'
           f'client = OpenAI(base_url="{base}", api_key="{key}")\n'
           f'reply = client.chat.completions.create(model="{model}", '
           f'messages=[{{"role": "user", "content": "Say hello in French."}}], max_tokens=32)\n'
           f'print(reply.choices[0].message.content)')
    return "\n".join([
        "",
        "pagegate dev mode: created tenant 'default' and this API key (shown once, keep it):",
        "",
        f"    {key}",
        "",
        "Try it with curl:",
        f"    curl {base}/chat/completions -H 'Authorization: Bearer {key}' \\",
        f"      -H 'Content-Type: application/json' -d {shlex.quote(body)}",
        "",
        "or with the OpenAI Python SDK:",
        *("    " + line for line in sdk.splitlines()),
        "",
    ])


async def prestart(settings: Settings) -> str | None:
    """Upgrade the schema; in dev mode bootstrap an empty database. Returns a new dev key, if any."""
    from gateway.db.session import Database

    db = Database(settings.database_url)
    try:
        await db.upgrade()
    finally:
        await db.dispose()
    if settings.dev_mode:
        return await bootstrap_dev(settings)
    return None


def uvicorn_options(settings: Settings) -> dict:
    """What ``uvicorn.run`` is given besides the app (uvloop and httptools: uvicorn's "auto")."""
    return {"host": settings.host, "port": settings.port, "log_level": settings.log_level.lower(),
            "access_log": settings.access_log, "timeout_graceful_shutdown": 10}


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app

    settings = Settings()
    updates: dict = {}
    if args.host:
        updates["host"] = args.host
    if args.port:
        updates["port"] = args.port
    if args.dev:
        updates["dev_mode"] = True
    if args.workers is not None:
        if not 1 <= args.workers <= 64:
            print("error: --workers must be between 1 and 64", file=sys.stderr, flush=True)
            return 2
        updates["workers"] = args.workers
    settings = settings.model_copy(update=updates)
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    embedded = None
    if settings.redis_url is None:
        from gateway.redis_server import EmbeddedRedis

        embedded = EmbeddedRedis(settings.data_dir)
        settings = settings.model_copy(update={"redis_url": embedded.start()})
        # uvicorn re-raises SIGTERM after its graceful shutdown; make that a SystemExit so the
        # `finally` below still stops the embedded Redis (tenancy helper's change)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        try:
            key = asyncio.run(prestart(settings))
        except Exception as exc:  # the database is down or the URL is wrong: say so in one line
            from gateway.db.session import safe_url

            reason = (str(exc).strip().splitlines() or [""])[0]
            print(f"error: cannot prepare the database at {safe_url(settings.database_url)}: "
                  f"{type(exc).__name__}: {reason}", file=sys.stderr, flush=True)
            return 1
        if settings.dev_mode:
            if key is not None:
                print(dev_banner(settings, key), flush=True)
            else:
                print("pagegate dev mode: the database already has tenants; create a key with "
                      "`pagegate admin keys create --tenant default`.", flush=True)
        if settings.workers > 1:
            from gateway.workers import run_workers

            return run_workers(settings)
        uvicorn.run(create_app(settings), **uvicorn_options(settings))
    finally:
        if embedded is not None:
            embedded.stop()
    return 0


if __name__ == "__main__":  # python -m gateway.serve
    parser = argparse.ArgumentParser(prog="pagegate")
    register(parser.add_subparsers(dest="command", required=True))
    sys.exit(run(parser.parse_args(["serve", *sys.argv[1:]])))
