"""Migrations create exactly the schema of gateway/db/models.py, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from gateway.db.models import Base
from gateway.db.session import Database

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
