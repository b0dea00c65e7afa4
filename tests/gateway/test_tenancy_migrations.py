"""Migrations create exactly the schema of gateway/db/models.py, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from gateway.db.models import Base
from gateway.db.session import Database, upgrade_sync

TABLES = {"tenants", "api_keys", "model_prices", "usage_records", "audit_log", "alembic_version"}


async def test_upgrade_creates_schema_matching_models(db_url):
    db = Database(db_url)
    try:
        await db.upgrade()  # already at head: must be a no-op

        def check(conn):
            assert set(inspect(conn).get_table_names()) == TABLES
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(ctx, Base.metadata)

        async with db.engine.connect() as conn:
            diff = await conn.run_sync(check)
        assert diff == []
    finally:
        await db.dispose()


async def test_upgrade_on_empty_sqlite_file(tmp_path):
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'sub' / 'fresh.db'}")
    try:
        await db.upgrade()
        async with db.engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        assert names == TABLES
    finally:
        await db.dispose()



def test_upgrade_logs_its_migrations_without_plugin_noise(tmp_path):
    """`pagegate serve` logs at INFO: a first upgrade in a fresh process says which migrations ran,
    not alembic's list of plugins."""
    code = ("import logging; logging.basicConfig(level='INFO'); from gateway.db.session import upgrade_sync; "
            f"upgrade_sync('sqlite+aiosqlite:///{tmp_path / 'logs.db'}')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "Running upgrade" in done.stderr
    assert "alembic.runtime.plugins" not in done.stderr, done.stderr


def test_upgrading_leaves_sys_path_alone(tmp_path, monkeypatch):
    """The upgrade runs inside `pagegate serve` and `pagegate admin`: it must not put the working
    directory on sys.path (alembic's prepend_sys_path did: a cache.py where the server was started
    then replaced pagegate's own `cache` package, a QA find)."""
    import sys

    from gateway.db.session import upgrade_sync

    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    upgrade_sync(f"sqlite+aiosqlite:///{tmp_path / 'path.db'}")
    assert sys.path == before



def test_two_upgrades_of_a_fresh_sqlite_file_at_once_both_succeed(tmp_path):
    """Found by QA: two `make run` on a fresh data dir both read "no schema" and one failed with
    "table audit_log already exists". Upgrades of one SQLite file take turns."""
    import threading

    url = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    errors: list[BaseException] = []

    def upgrade() -> None:
        try:
            upgrade_sync(url)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=upgrade) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
