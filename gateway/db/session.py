"""The database handle: one async SQLAlchemy engine + sessionmaker per process, and the schema
upgrade (``alembic upgrade head``) that ``pagegate serve`` runs on start.

SQLite (default, ``sqlite+aiosqlite:///./data/pagegate.db``) gets WAL mode, a busy timeout and
foreign keys; PostgreSQL goes through asyncpg (``postgresql+asyncpg://...``)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from gateway.private import private_file

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


_SECRET_QUERY_KEYS = frozenset({"password", "passwd", "pwd", "sslpassword"})


def safe_url(url: str) -> str:
    """The URL with any password hidden (it goes to a terminal or a log): the authority's, and one
    given as a query parameter (``?password=``, which asyncpg and psycopg also read; found by QA in
    clear in ``pagegate serve``'s error line)."""
    scheme, sep, rest = url.partition("://")
    authority, slash, tail = rest.partition("/")
    if sep and authority.count("@") > 1:  # an unescaped '@' in a password: all of the user part hidden
        return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{tail}"
    try:
        parsed = make_url(url)
        hidden = {k: "***" for k in parsed.query if k.lower() in _SECRET_QUERY_KEYS}
        if hidden:
            parsed = parsed.update_query_dict(hidden)
        return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")
    except Exception:  # unparsable (a port "abc"): hide what looks like a password (found by QA)
        url = re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)
        return re.sub(r"([?&](?:password|passwd|pwd|sslpassword)=)[^&]*", r"\1***", url, flags=re.IGNORECASE)


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001 - DBAPI callback
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=5000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


class Database:
    """Owns the async engine. ``sessionmaker()`` yields ``AsyncSession`` (expire_on_commit=False)."""

    def __init__(self, url: str, *, echo: bool = False, timeout_s: float = 5.0) -> None:
        """``timeout_s``: PostgreSQL connects and statements that take longer fail (asyncpg's
        ``timeout`` and ``command_timeout``): a database that stops answering is an error, never a
        hang of every request that needs it."""
        self.url = url
        self.timeout_s = timeout_s
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()  # "sqlite" | "postgresql"
        kwargs: dict = {"echo": echo}
        if self.dialect == "sqlite":
            db = parsed.database
            if db and db != ":memory:":
                with contextlib.suppress(OSError):  # unusable path: connecting will say so
                    Path(db).parent.mkdir(parents=True, exist_ok=True)
                    private_file(db)  # tenants, key hashes, usage: owner-only when created here
            kwargs["connect_args"] = {"timeout": 30}
        else:
            kwargs.update(pool_pre_ping=True, pool_size=10, max_overflow=20, pool_timeout=timeout_s)
            if self.dialect == "postgresql" and parsed.get_driver_name() == "asyncpg":
                kwargs["connect_args"] = {"timeout": timeout_s, "command_timeout": timeout_s}
        self.engine: AsyncEngine = create_async_engine(url, **kwargs)
        if self.dialect == "sqlite":
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        self.sessionmaker: async_sessionmaker[AsyncSession] = async_sessionmaker(
            self.engine, expire_on_commit=False
        )

    async def upgrade(self, revision: str = "head") -> None:
        """Run ``alembic upgrade <revision>`` on a worker thread (never on the event loop)."""
        await asyncio.to_thread(upgrade_sync, self.url, revision, connect_timeout_s=self.timeout_s)

    async def dispose(self) -> None:
        await self.engine.dispose()


def alembic_config(url: str, *, connect_timeout_s: float | None = None):  # noqa: ANN201 - alembic.config.Config
    """An Alembic config pointing at ``migrations/`` (works from an installed package).
    ``connect_timeout_s``: a PostgreSQL (asyncpg) connect that takes longer fails (asyncpg's own
    default is 60 s: a server that accepts and never answers held ``pagegate serve``'s start that
    long whatever ``PAGEGATE_DATABASE_TIMEOUT_S`` said). Statements are not bounded: a migration, or
    the wait for another gateway's, may take its time."""
    from alembic.config import Config

    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    parsed = make_url(url)
    if connect_timeout_s is not None and parsed.get_backend_name() == "postgresql" \
            and parsed.get_driver_name() == "asyncpg":
        cfg.attributes["connect_args"] = {"timeout": connect_timeout_s}
    return cfg


def upgrade_sync(url: str, revision: str = "head", *, connect_timeout_s: float | None = None) -> None:
    """Blocking ``alembic upgrade``; env.py runs it on its own event loop in this thread."""
    # alembic announces each of its autogenerate plugins at INFO when it is imported: start-up noise
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    from alembic import command

    with _sqlite_upgrade_lock(url):
        command.upgrade(alembic_config(url, connect_timeout_s=connect_timeout_s), revision)


@contextlib.contextmanager
def _sqlite_upgrade_lock(url: str):  # noqa: ANN202 - a context manager
    """One upgrade at a time of a SQLite file, across processes (found by QA: two `make run` started
    together on a fresh data dir both read "no schema", and one failed creating a table the other had
    made). PostgreSQL's upgrades take an advisory lock instead (migrations/env.py)."""
    parsed = make_url(url)
    path = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if not path or path == ":memory:" or path.startswith("file:"):
        yield
        return
    lock = Path(path).with_name(Path(path).name + ".upgrade-lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:  # an unusable path: the upgrade itself says so
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
