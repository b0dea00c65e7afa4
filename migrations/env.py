"""Alembic environment (async engines: aiosqlite / asyncpg). Runs on its own event loop, so
callers invoke it from a worker thread (``Database.upgrade``)."""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.db.models import Base

config = context.config
if config.config_file_name and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from pydantic import ValidationError

    from gateway.settings import Settings, settings_errors

    try:
        return Settings().database_url
    except ValidationError as exc:  # (one line, as `pagegate serve` prints it: never the values, a URL's password)
        raise SystemExit(f"error: invalid settings: {settings_errors(exc)}") from None


def _do_run(connection) -> None:  # noqa: ANN001 - sync Connection
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":  # gateways starting together upgrade one at a time
            connection.execute(text("SELECT pg_advisory_xact_lock(7472615)"))
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(_url(), poolclass=pool.NullPool,
                                 connect_args=config.attributes.get("connect_args", {}))
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_do_run)
            await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
