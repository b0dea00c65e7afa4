"""``pagegate serve [--host H] [--port P] [--dev] [--workers N]``: the gateway under uvicorn (with
``--workers`` above 1, N worker processes in front of one engine process: ``gateway.workers``).

Before serving: check the port, the usage spool and Redis (starting an embedded one when
``PAGEGATE_REDIS_URL`` is unset), upgrade the database schema (``alembic upgrade head``), and in dev
mode (``make run``) on an empty database create a ``default`` tenant and print one API key with a
curl and an OpenAI-SDK example. Each of these that fails is one ``error:`` line on stderr and exit
status 1, before any model is loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import re
import shlex
import signal
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from gateway.keys import KEY_PREFIX
from gateway.private import private_dir
from gateway.settings import (
    Settings,
    is_loopback,
    miscased_refusal,
    python_log_level,
    settings_errors,
    unknown_settings,
)

if TYPE_CHECKING:
    from gateway.redis_server import EmbeddedRedis

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
    p.set_defaults(func=run_and_exit)


MAX_MODEL_ID_CHARS = 128  # usage_records.model, model_prices.model


def served_model_id(settings: Settings) -> str:
    if settings.served_model_name:
        return settings.served_model_name
    from engine.weights import served_name

    return served_name(settings.model)


async def bootstrap_dev(settings: Settings) -> tuple[str, str] | None:
    """On a database without (live) tenants: a ``default`` tenant and one key
    (``tenancy.bootstrap_dev_tenant``); returns (the tenant's name, the key)."""
    from gateway import tenancy
    from gateway.db.session import Database

    db = Database(settings.database_url, timeout_s=settings.database_timeout_s)
    try:
        async with db.sessionmaker() as session:
            made = await tenancy.bootstrap_dev_tenant(session)
            if made is not None:
                await _audit_bootstrap(session, *made)
            await session.commit()
            return made
    finally:
        await db.dispose()


DEV_ACTOR = "pagegate serve --dev"


async def _audit_bootstrap(session, tenant_name: str, key: str) -> None:  # noqa: ANN001 - an AsyncSession
    """The audit rows of the dev tenant and key, as the admin surface writes them for its own changes,
    committed with them (found by QA: "every change is written to the audit_log table" had two
    exceptions). Without the admin package (an embedding without it), none."""
    try:
        from admin import audit
        from admin.management import key_view, tenant_view
    except ImportError:
        return
    from sqlalchemy import select

    from gateway.db.models import ApiKey, Tenant
    from gateway.keys import hash_key

    tenant = (await session.execute(select(Tenant).where(Tenant.name == tenant_name))).scalar_one()
    row = (await session.execute(select(ApiKey).where(ApiKey.key_hash == hash_key(key)))).scalar_one()
    await session.refresh(tenant)
    await session.refresh(row)
    audit.record(session, actor=DEV_ACTOR, action="tenant.create", target=f"tenant:{tenant.name}",
                 after=tenant_view(tenant), detail="development mode: a database without live tenants")
    audit.record(session, actor=DEV_ACTOR, action="key.create", target=f"key:{row.prefix}",
                 after=key_view(row, tenant.name))


def cli_name() -> str:
    """How to call this CLI from the current directory: ``pagegate`` when that is on PATH, else
    its path (``make run`` runs ``.venv/bin/pagegate``, which a new shell does not find)."""
    import shutil

    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    on_path = shutil.which("pagegate")
    if not argv0.endswith("pagegate") or (on_path and os.path.realpath(on_path) == os.path.realpath(argv0)):
        return "pagegate"
    relative = os.path.relpath(argv0)
    return relative if not relative.startswith("..") and os.sep in relative else os.path.abspath(argv0)


def client_origin(settings: Settings) -> str:
    """Where a client on this machine reaches the server: a wildcard host (0.0.0.0, ::) is not an
    address to call (found by QA: the banner said curl http://0.0.0.0:8000)."""
    host = settings.host.strip("[]")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{host}]:{settings.port}" if ":" in host else f"http://{host}:{settings.port}"


def check_dev_mode(settings: Settings) -> None:
    """Dev mode takes admin tokens signed with the built-in secret, which is public: only on a
    loopback address (found by QA: ``--dev --host 0.0.0.0`` let anyone on the network mint an
    admin:write token). With a secret of one's own it may listen anywhere, with a warning."""
    if not settings.dev_mode or is_loopback(settings.host):
        return
    if settings.placeholder_admin_secret:
        raise StartupError(f"dev mode (--dev, PAGEGATE_DEV_MODE) on {settings.host} would let anyone who reaches "
                           "the port sign admin tokens with the built-in secret, which is public: listen on "
                           "127.0.0.1 (the default), or set PAGEGATE_ADMIN_JWT_SECRET to a secret of your own")
    logging.getLogger("pagegate").warning("dev mode on %s, an address others may reach: it creates a tenant and "
                                          "prints its key when the database has none", settings.host)


def dev_banner(settings: Settings, key: str, tenant: str = "default") -> str:
    base = f"{client_origin(settings)}/v1"
    cli = cli_name()
    model = served_model_id(settings)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello in French."}],
                       "max_tokens": 32})
    sdk = (f'from openai import OpenAI\n'
           f'client = OpenAI(base_url="{base}", api_key="{key}")\n'
           f'reply = client.chat.completions.create(model="{model}", '
           f'messages=[{{"role": "user", "content": "Say hello in French."}}], max_tokens=32)\n'
           f'print(reply.choices[0].message.content)')
    if not settings.load_engine:  # (found by QA: the examples below answered 404 model_not_found)
        sdk += ("\n# PAGEGATE_LOAD_ENGINE=false: no chat model is loaded, so chat and completions answer 404\n"
                "# model_not_found; /v1/embeddings and the admin API work")
    return "\n".join([
        "",
        f"pagegate dev mode: created tenant '{tenant}' and this API key (shown once, keep it):",
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
        f"Admin: `{cli} admin --help` (tenants, keys, prices, reports); the dashboard at",
        f"    {client_origin(settings)}/admin, signed in with a token from `{cli} admin token`.",
        "",
    ])


class StartupError(Exception):
    """A start-up dependency that cannot be used; ``run`` prints it as one line and exits 1."""


def _reason(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def check_port(host: str, port: int) -> None:
    """Bind-probe the address (``gateway.workers.probe_port``, as the workers' listeners do) so a
    taken port fails now, not after the engine has loaded; uvicorn binds it for good once the app
    has started."""
    from gateway.workers import probe_port

    if not 0 <= port <= 65535:  # getaddrinfo would quietly take it modulo 65536
        raise StartupError(f"cannot listen on {host}:{port}: a port is between 1 and 65535")
    if port == 0:  # (found by QA: the dev banner then named port 0, and clients, workers and CORS need the port)
        raise StartupError(f"cannot listen on {host}:0: name the port to serve on (0, any free port, is not "
                           "supported: the banner, the workers and the clients need to know it)")
    try:
        probe_port(host, port)
    except (OSError, OverflowError, UnicodeError) as exc:  # taken, not ours, no such host, port > 65535
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise StartupError(f"cannot listen on {host}:{port}: {reason}") from None


def warn_missing_jwks_file(settings: Settings) -> None:
    """A key set named as a file that is not there (a typo) is said at start-up: identity-provider
    tokens are refused until it exists (found by QA: ``PAGEGATE_ADMIN_JWKS_URL=notaurl`` started in
    silence). Not an error: the file may be provisioned after the server starts; it is read then."""
    from admin.jwks import local_path

    path = local_path(settings.admin_jwks_url) if settings.admin_jwks_url else None
    if path is not None and not os.path.isfile(path):
        logging.getLogger("pagegate").warning(
            "PAGEGATE_ADMIN_JWKS_URL names no file (%s): identity-provider admin tokens are refused until it "
            "exists (a URL starts with https://)", os.path.abspath(path))


def check_spool_dir(path: str) -> None:
    """The usage spool must be a directory this process can write (every usage row lands there first)."""
    folder = os.path.abspath(path)
    try:
        here = os.getcwd()
    except OSError:  # (a working directory removed meanwhile: nothing of it to take)
        here = None
    if here is not None and os.path.commonpath([folder, here]) == folder:  # (found by QA: its files taken as the spool's)
        raise StartupError(f"the usage spool directory {folder} is the working directory or one above it: "
                           "give PAGEGATE_USAGE_SPOOL_DIR a folder of its own")
    try:
        private_dir(folder)  # (its rows name tenants, keys and costs)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise StartupError(f"cannot use the usage spool directory {folder}: {exc.strerror or exc}") from None


def safe_redis_url(url: str) -> str:
    """The Redis URL with any password (in the authority or a ``password=`` query) hidden."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # unparsable: show none of it rather than a password
        return "(an unparsable URL)"
    in_query = "password" in dict(parse_qsl(parts.query))
    if password is None and not in_query:
        return url
    netloc, query = parts.netloc, parts.query
    if password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    if in_query:
        query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(query)], safe="*")
    # not urlunsplit: it turns unix:///path (an empty host) into unix:/path
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def check_redis(url: str, timeout_s: float) -> None:
    """PING once, without redis-py's retries, so a wrong or unreachable Redis fails in one line."""
    from gateway.redis_server import client_without_retries

    try:
        client = client_without_retries(url, connect_timeout_s=timeout_s, timeout_s=timeout_s)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        reason = _reason(exc)
        password = _password(url)
        if password:
            reason = reason.replace(password, "***")
        raise StartupError(f"cannot use Redis at {safe_redis_url(url)}: {reason}") from None


def _password(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return parts.password or dict(parse_qsl(parts.query)).get("password")


def check_engine(settings: Settings) -> None:
    """The engine's settings and the model they name, checked without loading anything (a wrong
    ``PAGEGATE_MODEL`` would otherwise fail seconds later, inside the app's start-up)."""
    if not settings.load_engine or settings.engine_socket:
        return
    from engine.weights import model_source

    try:
        settings.engine_config()  # EngineConfig checks its values (block size, backends, device, ...)
        model_source(settings.model)
        served = served_model_id(settings)
        if len(served) > MAX_MODEL_ID_CHARS:  # (a usage row holds it: every row would be refused, a QA find)
            raise ValueError(f"the served model id {served[:40]!r}... is {len(served)} characters, more than the "
                             f"{MAX_MODEL_ID_CHARS} a usage row holds: " + (
                                 "shorten PAGEGATE_SERVED_MODEL_NAME" if settings.served_model_name else
                                 "set PAGEGATE_SERVED_MODEL_NAME to a shorter name"))
        from engine.llm_engine import check_backend, check_kv_pool, resolve_device

        device = resolve_device(settings.device)  # (a CUDA device this torch cannot use: refused)
        check_backend(settings.attention_backend, device)  # (triton without a GPU or its interpreter)
        if settings.num_blocks is None:  # the pool's size before the model is loaded: its budget
            check_kv_pool(settings.kv_cache_memory_gb * 2**30, device)
    except ValueError as exc:
        raise StartupError(f"cannot use the engine's settings: {_by_variable(str(exc))}") from None


# EngineConfig's fields whose setting has another name
_ENGINE_FIELD_SETTING = {"max_waiting_per_class": "max_waiting_per_tenant"}


def _by_variable(message: str) -> str:
    """An EngineConfig refusal with each field named by the variable that sets it (found by QA:
    ``block_size must be one of …`` where every other refusal names ``PAGEGATE_BLOCK_SIZE``)."""
    from dataclasses import fields

    from engine.config import EngineConfig

    for f in fields(EngineConfig):
        setting = _ENGINE_FIELD_SETTING.get(f.name, f.name)
        if setting in Settings.model_fields and ("_" in f.name or message.startswith(f"{f.name} ")):
            message = re.sub(rf"\b{f.name}\b", f"PAGEGATE_{setting.upper()}", message)
    return message


def check_embedding_model(settings: Settings) -> None:
    """``PAGEGATE_EMBEDDING_MODEL`` names a model that can be loaded: the bundled MiniLM, a local
    sentence-transformers directory, or (offline) one in the Hugging Face cache. Checked without
    loading it (found by QA: a wrong path started, then every embedding was a 500 and the cache
    turned itself off)."""
    from cache.embedder import resolve_model_path

    name = settings.embedding_model
    try:
        path = resolve_model_path(name)
    except ImportError as exc:  # the bundled model's package is missing
        raise StartupError(f"cannot use the embedding model {name!r}: {exc}") from None
    refused = f"cannot use the embedding model {name!r} (PAGEGATE_EMBEDDING_MODEL)"
    folder = os.path.expanduser(path)
    if os.path.isdir(folder):
        if not _model_config(folder):
            raise StartupError(f"{refused}: {folder} holds no transformers model (a config.json naming its "
                               "model_type)")
        return
    if path.startswith(("/", ".", "~")) or path.count("/") > 1:  # a path, not a hub id ("org/name")
        raise StartupError(f"{refused}: no such directory")
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", path) or "--" in path or ".." in path:
        raise StartupError(f"{refused}: not a directory nor a model name (org/name)")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        from huggingface_hub import try_to_load_from_cache

        repos = (path, f"sentence-transformers/{path}") if "/" not in path else (path,)
        found = []
        for repo in repos:
            with contextlib.suppress(Exception):  # (an id the hub's rules refuse)
                found.append(try_to_load_from_cache(repo, "config.json"))
        if not any(isinstance(f, str) and _model_config(os.path.dirname(f)) for f in found):
            raise StartupError(f"{refused}: not a local directory, and not in the Hugging Face cache "
                               "(HF_HUB_OFFLINE is set)")


def _model_config(folder: str) -> bool:
    """Whether ``folder`` holds a transformers model's config.json (with its ``model_type``), as
    sentence-transformers needs to load it (found by QA: a folder with any config.json passed the
    start, then every embedding was a 500)."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("model_type"), str)


def start_embedded_redis(embedded: EmbeddedRedis) -> str:
    try:
        return embedded.start()
    except Exception as exc:  # data dir unusable, no redis-server binary
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else _reason(exc)
        raise StartupError(f"cannot start the embedded Redis in {embedded.dir}: {reason}") from None


async def prestart(settings: Settings) -> tuple[str, str] | None:
    """Upgrade the schema; in dev mode bootstrap an empty database. Returns (tenant, key) made, if any.
    Raises StartupError when the database cannot be used."""
    from gateway.db.session import Database, safe_url

    try:
        db = Database(settings.database_url, timeout_s=settings.database_timeout_s)
        try:
            await db.upgrade()
        finally:
            await db.dispose()
        if settings.dev_mode:
            return await bootstrap_dev(settings)
        return None
    except Exception as exc:  # the database is down or the URL is wrong
        raise StartupError(f"cannot prepare the database at {safe_url(settings.database_url)}: "
                           f"{_reason(exc)}") from None


class RedactKeys(logging.Filter):
    """API keys out of uvicorn's access log: a client that sends its key in the URL
    (``?api_key=pg-…``, refused with a 401) had it written to the log (found by a security QA)."""

    KEY = re.compile(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_-]{16,}")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self.redact(a) if isinstance(a, str) else a for a in record.args)
        return True

    def redact(self, text: str) -> str:
        """``text`` without keys, also percent-encoded ones (``pg%2D…``, every character ``%XX``:
        found by a security QA, logged in full); such a line is logged decoded."""
        text = self.KEY.sub(KEY_PREFIX + "***", text)
        if "%" in text:
            plain = unquote(text)
            if self.KEY.search(plain):
                return self.KEY.sub(KEY_PREFIX + "***", plain)
        return text


def redact_access_log() -> None:
    """Once uvicorn has configured its loggers (``uvicorn.Config``)."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactKeys) for f in access.filters):
        access.addFilter(RedactKeys())


def uvicorn_options(settings: Settings) -> dict:
    """What ``uvicorn.Config`` is given besides the app: uvloop, and httptools with limits on a
    request's head (``gateway.http_guard``). ``X-Forwarded-For`` is read only from the addresses
    in ``forwarded_allow_ips`` (uvicorn's own default trusts it from 127.0.0.1, so any local client
    could pick the address the per-address limit counts)."""
    from gateway.http_guard import guarded_protocol

    trusted = [a.strip() for a in settings.forwarded_allow_ips.split(",") if a.strip()]
    networks = [ipaddress.ip_network(a, strict=False) for a in trusted if a != "*"]

    def is_proxy(address: str) -> bool:  # a proxy's connections carry many clients: not capped per address
        if "*" in trusted:
            return True
        if not networks:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in networks)

    per_address = settings.max_connections_per_address or None
    return {"host": settings.host, "port": settings.port, "log_level": settings.log_level.lower(),
            "access_log": settings.access_log, "timeout_graceful_shutdown": 10,
            "http": guarded_protocol(settings.max_header_bytes, settings.header_timeout_s,
                                     max_connections=connection_budget(), max_connections_per_address=per_address,
                                     trusted=is_proxy),
            "proxy_headers": bool(trusted), "forwarded_allow_ips": trusted or None}


FD_RESERVE = 256  # descriptors kept for the process's own files, database, Redis and engine sockets


def connection_budget() -> int | None:
    """Raise the soft limit on open files to the hard one (a default of 1,024 let ~1,000 idle
    sockets stop the server: found by a security QA), and return how many client connections fit
    below it with ``FD_RESERVE`` to spare (None: no limit known)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else soft
        if soft != resource.RLIM_INFINITY and soft < hard:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                soft = hard
            except (ValueError, OSError):
                pass
    except ImportError:  # (not on POSIX)
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    return max(64, soft - FD_RESERVE)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(0)  # a stop asked for: status 0, as with --workers and Ctrl+C (143 reads as a failure)


def _settings(args: argparse.Namespace) -> Settings:
    from pydantic import ValidationError

    miscased = miscased_refusal()
    if miscased is not None:
        raise StartupError(miscased)
    try:
        settings = Settings()
    except ValidationError as exc:  # e.g. PAGEGATE_PORT=abc
        raise StartupError(f"invalid settings: {settings_errors(exc)}") from None
    updates: dict = {}
    if args.host is not None:  # (found by QA: --port 0 was taken as not given)
        updates["host"] = args.host
    if args.port is not None:
        updates["port"] = args.port
    if args.dev:
        updates["dev_mode"] = True
    if args.workers is not None:
        updates["workers"] = args.workers
    return settings.model_copy(update=updates)


def run(args: argparse.Namespace) -> int:
    if args.workers is not None and not 1 <= args.workers <= 64:
        print("error: --workers must be between 1 and 64", file=sys.stderr, flush=True)
        return 2
    embedded = None
    lost: list = []  # non-empty once the embedded Redis is gone (``_embedded_redis_lost``)
    unwatch: Callable[[], None] = lambda: None  # noqa: E731
    try:
        try:
            settings = _settings(args)
            logging.basicConfig(level=python_log_level(settings),
                                format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            for name, meant in unknown_settings():  # (found by QA: a misspelt setting was ignored in silence)
                logging.getLogger("pagegate").warning("%s is not a pagegate setting: ignored%s", name,
                                                      f" (did you mean {meant}?)" if meant else "")
            # cheapest first, and all before the engine loads (which takes seconds)
            if settings.engine_socket:  # (found by QA: set by hand, the start-up waited 10 minutes, deaf to signals)
                raise StartupError("PAGEGATE_ENGINE_SOCKET is set: `pagegate serve --workers N` sets it for its "
                                   "own worker processes only; unset it to start a server")
            for name in ("worker_index", "metrics_dir"):  # (found by QA: set by hand, a warning a second)
                if getattr(settings, name) is not None:
                    raise StartupError(f"PAGEGATE_{name.upper()} is set: `pagegate serve --workers N` sets it for "
                                       "its own worker processes only; unset it to start a server")
            check_dev_mode(settings)
            warn_missing_jwks_file(settings)
            check_port(settings.host, settings.port)
            check_spool_dir(settings.usage_spool_dir)
            # uvicorn re-raises SIGTERM after its graceful shutdown; make that a SystemExit so the
            # `finally` below still stops an embedded Redis, and the status is 0
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
            if settings.redis_url is None:
                from gateway.redis_server import EmbeddedRedis

                embedded = EmbeddedRedis(settings.data_dir)
                settings = settings.model_copy(update={"redis_url": start_embedded_redis(embedded)})
                unwatch = embedded.watch(partial(_embedded_redis_lost, lost))
            check_redis(settings.redis_url, settings.redis_timeout_s)
            check_engine(settings)
            check_embedding_model(settings)
            made = asyncio.run(prestart(settings))
        except StartupError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 1
        if settings.dev_mode:
            if made is not None:  # (found by QA: named 'default' when it was default-2)
                print(dev_banner(settings, made[1], made[0]), flush=True)
            else:
                cli = cli_name()
                print(f"pagegate dev mode: the database already has tenants; create a key with "
                      f"`{cli} admin keys create --tenant NAME` (`{cli} admin tenants list` names them); "
                      f"the dashboard is at {client_origin(settings)}/admin.", flush=True)
        if settings.workers > 1:
            from gateway.workers import run_workers

            status = run_workers(settings)
            return 1 if lost else status
        import uvicorn

        from gateway.app import create_app
        from gateway.shutdown import DrainingServer

        server = DrainingServer(uvicorn.Config(create_app(settings), **uvicorn_options(settings)))
        redact_access_log()
        try:
            with contextlib.suppress(KeyboardInterrupt):
                server.run()
        except SystemExit as exc:
            if exc.code == 3 or lost:  # uvicorn's "startup failed" (it logged why), or Redis lost
                return 1
            raise
        if not server.started:  # (uvicorn releases that return instead of exiting 3)
            return 1
    finally:
        unwatch()
        if embedded is not None:
            embedded.stop()
    return 1 if lost else 0


def run_and_exit(args: argparse.Namespace) -> NoReturn:
    """``run``, then the process ends at once (``exit_at_once``)."""
    exit_at_once(partial(run, args))


def exit_at_once(main: Callable[[], int]) -> NoReturn:
    """``main()``, then the process ends at once: everything is shut down by then (usage rows
    written, the engine stopped, the embedded Redis saved and stopped), and the interpreter's own
    teardown of the model's and the caches' objects took seconds more (found by QA: 4-10 s after
    uvicorn's "Finished server process" on a busy machine, 13-17 s from the signal where about 12
    were documented, close to docker-compose's 20 s before a SIGKILL). ``pagegate serve`` and, with
    ``--workers``, its engine and worker processes end this way."""
    try:
        status = main()
    except SystemExit as exc:  # the SIGTERM's (``_exit_on_sigterm``, re-raised by uvicorn): 0
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    logging.shutdown()  # (the log handlers flushed and closed, as at a normal exit)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _embedded_redis_lost(lost: list) -> None:
    """The embedded Redis this server started (or shares) is gone: every request would be a 503
    while /health says ok, so stop the whole server (status 1) for a process manager, or the user,
    to start it again with a fresh Redis from its snapshot."""
    lost.append(True)
    logging.getLogger("pagegate").error(
        "the embedded Redis stopped (killed?): limits, quotas and the cache cannot work without it; pagegate "
        "serve stops (exit status 1) so that it can be started again (set PAGEGATE_REDIS_URL to use a Redis "
        "of your own)")
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":  # python -m gateway.serve
    parser = argparse.ArgumentParser(prog="pagegate")
    register(parser.add_subparsers(dest="command", required=True))
    run_and_exit(parser.parse_args(["serve", *sys.argv[1:]]))
