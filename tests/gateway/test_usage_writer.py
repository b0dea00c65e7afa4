"""The batched usage writer: spool first, database later; none lost, none duplicated."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import shutil
import time
import uuid
from decimal import Decimal

import pytest
from sqlalchemy import func, select, text

from gateway.db.models import ApiKey, Tenant, UsageRecord
from gateway.db.session import Database
from gateway.usage import UsageEvent, UsageWriter, _row_from_json


def _disk_full(*_args: object) -> bool:
    """What a write to a full disk does (monkeypatched over the journal's append and the spool's write)."""
    raise OSError(errno.ENOSPC, "No space left on device")


def _events(tenant_id: int, n: int, tag: str = "") -> list[UsageEvent]:
    return [UsageEvent(request_id=f"{tag}{uuid.uuid4().hex}", tenant_id=tenant_id, model="m", status="ok",
                       prompt_tokens=i, completion_tokens=1, cost_usd=Decimal("0.00000123"),
                       latency_ms=1.5, ttft_ms=0.5, finish_reason="stop") for i in range(n)]


def test_a_row_is_one_json_line_with_every_field():
    """``to_json`` writes the fields one by one: it must stay ``json.dumps`` of all of them."""
    import json
    from dataclasses import fields
    from datetime import UTC, datetime, timedelta, timezone

    created = datetime(2026, 11, 29, 21, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    odd = UsageEvent(request_id='r"\\\n\u00e9\U0001f600', tenant_id=3, model="m/é", status="ok", created_at=created,
                     api_key_id=None, endpoint="completions", prompt_tokens=5, cached_prompt_tokens=2,
                     completion_tokens=7, cost_usd=Decimal("0.00000123"), saved_usd=Decimal(0), latency_ms=12.5,
                     ttft_ms=None, finish_reason=None, cache="semantic-hit")
    plain = UsageEvent(request_id="x", tenant_id=1, model="m", status="error", created_at=created.astimezone(UTC),
                       api_key_id=9, ttft_ms=0.25, finish_reason="length")
    for event in (odd, plain):
        line = event.to_json()
        assert "\n" not in line
        expected = {f.name: getattr(event, f.name) for f in fields(UsageEvent)}
        del expected["created_at"]
        expected["created_us"] = 1795978800123456  # 2026-11-29T19:00:00.123456Z
        expected["cost_usd"], expected["saved_usd"] = str(event.cost_usd), str(event.saved_usd)
        assert json.loads(line) == expected
        row = _row_from_json(line)
        assert row["created_at"] == created and row["created_at"].tzinfo is UTC
        assert {k: v for k, v in row.items() if k != "created_at"} == {
            k: Decimal(v) if k.endswith("_usd") else v for k, v in expected.items() if k != "created_us"}


def test_a_row_without_a_time_gets_the_time_it_is_written():
    from datetime import UTC, datetime

    before = datetime.now(UTC)
    row = _row_from_json(UsageEvent(request_id="x", tenant_id=1, model="m", status="ok").to_json())
    assert before <= row["created_at"] <= datetime.now(UTC)


def test_rows_of_older_journals_with_an_iso_time_are_read():
    """Journals written before ``created_us`` carry ``created_at`` in ISO 8601 (any offset)."""
    from datetime import UTC, datetime

    line = ('{"request_id":"r","tenant_id":1,"model":"m","status":"ok","created_at":"2026-11-29T21:00:00.5+02:00",'
            '"api_key_id":null,"endpoint":"completions","prompt_tokens":1,"cached_prompt_tokens":0,'
            '"completion_tokens":2,"cost_usd":"0.00000001","saved_usd":"0","latency_ms":1.0,"ttft_ms":null,'
            '"finish_reason":"stop","cache":"miss"}')
    row = _row_from_json(line)
    assert row["created_at"] == datetime(2026, 11, 29, 19, 0, 0, 500000, tzinfo=UTC)
    assert row["cost_usd"] == Decimal("0.00000001") and row["completion_tokens"] == 2


async def _count(db: Database) -> tuple[int, int]:
    async with db.sessionmaker() as s:
        n, distinct = (await s.execute(select(func.count(), func.count(func.distinct(UsageRecord.request_id))))).one()
    return n, distinct


async def _add_tenant(db: Database) -> int:
    async with db.sessionmaker() as s:
        t = Tenant(name="t1", budget_period="month")
        s.add(t)
        await s.commit()
        return t.id


async def test_batches_reach_the_database(db_url, tmp_path):
    db = Database(db_url)
    tid = await _add_tenant(db)
    writer = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=0.05, batch_size=500)
    await writer.start()
    try:
        async with db.sessionmaker() as s:
            key = ApiKey(tenant_id=tid, key_hash="h" * 64, prefix="pg-test", revoked=False)
            s.add(key)
            await s.commit()
        events = _events(tid, 1200)
        events[5].api_key_id = key.id
        for e in events:
            writer.record(e)  # never awaits
        assert writer.pending == 1200
        assert await writer.flush()
        assert await _count(db) == (1200, 1200)
        assert writer.files_spooled <= 3 and writer.spooled_files() == []
        async with db.sessionmaker() as s:
            row = (await s.execute(select(UsageRecord).where(UsageRecord.request_id == events[7].request_id))).scalar_one()
            used = (await s.execute(select(ApiKey.last_used_at).where(ApiKey.id == key.id))).scalar_one()
        assert (row.prompt_tokens, row.cost_usd, row.finish_reason) == (7, Decimal("0.00000123"), "stop")
        assert used is not None  # the key's last use moved forward with the batch
        # the background task alone also writes (no explicit flush)
        writer.record(_events(tid, 1)[0])
        for _ in range(100):
            if (await _count(db))[0] == 1201:
                break
            await asyncio.sleep(0.05)
        assert await _count(db) == (1201, 1201)
    finally:
        await writer.close()
        await db.dispose()


async def test_rows_are_sealed_every_flush_and_inserted_every_db_interval(db_url, tmp_path):
    """Sealing (the durability) keeps the flush interval; the inserts, whose thread hand-offs slow
    the engine, wait for ``db_interval_s``, unless a batch's worth of rows waits or ``flush()``."""
    db = Database(db_url)
    tid = await _add_tenant(db)
    writer = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=0.05, batch_size=50, db_interval_s=3600)
    await writer.start()
    try:
        assert await writer.flush()  # the first pass (the spool's replay) sets the clock going
        for e in _events(tid, 5, "a"):
            writer.record(e)
        for _ in range(100):  # sealed into the spool by the background flushes
            if writer.spooled_files():
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # several flush intervals
        assert writer.spooled_files() and await _count(db) == (0, 0)
        for e in _events(tid, 50, "b"):  # a batch's worth waits: inserted without waiting the hour
            writer.record(e)
        for _ in range(100):
            if (await _count(db))[0] == 55:
                break
            await asyncio.sleep(0.05)
        assert await _count(db) == (55, 55) and writer.spooled_files() == []
        writer.record(_events(tid, 1, "c")[0])
        assert await writer.flush() and await _count(db) == (56, 56)  # flush() does not wait either
    finally:
        await writer.close()
        await db.dispose()


async def test_database_down_rows_spooled_then_written_once(pg_template, pg_tools, tmp_path):
    """The database does not exist yet (down); it appears later with the schema and a tenant."""
    name = f"pgt_down_{uuid.uuid4().hex[:8]}"
    db = Database(pg_tools.url(name))
    writer = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=0.05, max_backoff_s=0.2)
    await writer.start()
    try:
        events = _events(1, 300)
        for e in events[:200]:
            writer.record(e)
        assert await writer.flush() is False  # DB down: rows are on disk, not lost
        spooled = writer.spooled_files()
        assert spooled and sum(len(p.read_text().splitlines()) for p in spooled) == 200
        for e in events[200:]:
            writer.record(e)
        await asyncio.sleep(0.2)
        # the database comes back: created under a temp name, then renamed into place atomically
        tmp = name + "_tmp"
        await pg_tools.execute(f'CREATE DATABASE "{tmp}" TEMPLATE "{pg_template}"')
        tmp_db = Database(pg_tools.url(tmp))
        await _add_tenant(tmp_db)
        await tmp_db.dispose()
        await pg_tools.execute(f'ALTER DATABASE "{tmp}" RENAME TO "{name}"')
        for _ in range(200):  # the writer retries on its own (backoff <= 0.2 s)
            if not writer.spooled_files() and writer.pending == 0:
                break
            await asyncio.sleep(0.05)
        assert writer.spooled_files() == []
        assert await _count(db) == (300, 300)
        # a crash between insert and unlink means a replayed file: still no duplicates
        replay = tmp_path / "spool" / "00000000000000000000-1-000000.jsonl"
        replay.write_text("".join(e.to_json() + "\n" for e in events[:50]))
        assert await writer.flush()
        assert await _count(db) == (300, 300)
    finally:
        await writer.close()
        await db.dispose()
        await pg_tools.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await pg_tools.execute(f'DROP DATABASE IF EXISTS "{name}_tmp" WITH (FORCE)')


async def test_flushes_asked_for_while_the_database_is_down_log_one_line(tmp_path, caplog):
    """Found by QA: with the database down, each quota rebuild's flush (once a second per budget
    tenant whose counter was missing) logged its own "database unavailable" warning, each saying
    "retry in 10.0s". They share one line per 5 s, which counts the others."""
    import logging

    broken_dir = tmp_path / "missing-dir"
    broken_dir.write_text("a file where a directory should be")  # an unusable database
    broken = Database(f"sqlite+aiosqlite:///{broken_dir / 'x' / 'nope.db'}")
    writer = UsageWriter(broken.url, tmp_path / "spool", flush_interval_s=60)
    await writer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.usage"):
            for e in _events(1, 5):
                writer.record(e)
                assert await writer.flush() is False
        lines = [r.getMessage() for r in caplog.records if "database unavailable" in r.getMessage()]
        assert len(lines) == 1 and "next retry in" in lines[0], lines
    finally:
        await writer.close()
        await broken.dispose()


async def test_restart_replays_the_spool(sqlite_url, tmp_path):
    spool = tmp_path / "spool"
    broken = Database(f"sqlite+aiosqlite:///{tmp_path / 'missing-dir' / 'x' / 'nope.db'}")
    shutil.rmtree(tmp_path / "missing-dir", ignore_errors=True)
    (tmp_path / "missing-dir").write_text("a file where a directory should be")  # unusable database
    first = UsageWriter(broken.url, spool, flush_interval_s=0.05)
    await first.start()
    db = Database(sqlite_url)
    tid = await _add_tenant(db)
    events = _events(tid, 40)
    for e in events:
        first.record(e)
    await first.close()  # "process exits" with the DB unreachable: rows stay spooled
    await broken.dispose()
    assert sum(len(p.read_text().splitlines()) for p in first.spooled_files()) == 40

    second = UsageWriter(db.url, spool, flush_interval_s=0.05)
    await second.start()  # a restarted process replays on its own
    try:
        for _ in range(100):
            if not second.spooled_files():
                break
            await asyncio.sleep(0.05)
        assert await _count(db) == (40, 40)
    finally:
        await second.close()
        await db.dispose()


async def test_rows_the_database_rejects_do_not_block_the_spool(pg_url, tmp_path):
    db = Database(pg_url)
    tid = await _add_tenant(db)
    writer = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=0.05)
    await writer.start()
    try:
        good = _events(tid, 5)
        bad = _events(tid + 999, 1)  # unknown tenant: foreign key violation
        # a status longer than its column: a data error, which asyncpg's dialect raises as a plain
        # DBAPIError (found by QA: taken for the database being down, it blocked every later row)
        too_long = [dataclasses.replace(_events(tid, 1)[0], status="s" * 40)]
        for e in good[:2] + bad + too_long + good[2:]:
            writer.record(e)
        assert await writer.flush()
        assert await _count(db) == (5, 5)
        rejected = list((tmp_path / "spool" / "rejected").iterdir())
        assert len(rejected) == 1 and bad[0].request_id in rejected[0].read_text()
        assert too_long[0].request_id in rejected[0].read_text()
        # a damaged spool file is set aside too, and the rows after it still get in
        (tmp_path / "spool" / "00000000000000000001-1-000000.jsonl").write_text('{"request_id": "x", trunc\n')
        late = _events(tid, 3)
        for e in late:
            writer.record(e)
        assert await writer.flush()
        assert await _count(db) == (8, 8)
        assert len(list((tmp_path / "spool" / "rejected").iterdir())) == 2
        async with db.sessionmaker() as s:
            assert (await s.execute(text("select count(*) from usage_records"))).scalar() == 8
    finally:
        await writer.close()
        await db.dispose()


_CRASHER = """
import asyncio, os, sys
from decimal import Decimal
from gateway.usage import UsageEvent, UsageWriter

async def main():
    writer = UsageWriter(sys.argv[1], sys.argv[2], flush_interval_s=3600, batch_size=10_000)
    await writer.start()
    writer.record(UsageEvent(request_id=sys.argv[3], tenant_id=int(sys.argv[4]), model="m", status="ok",
                             prompt_tokens=3, completion_tokens=4, cost_usd=Decimal("0.5")))
    print("recorded", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_row_survives_a_sigkill_right_after_record(sqlite_url, tmp_path):
    """record() returned, then the process is killed before any flush: the row is still written
    (by the next writer sharing the spool), exactly once."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    db = Database(sqlite_url)
    tid = await _add_tenant(db)
    spool = tmp_path / "spool"
    request_id = f"crash-{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", _CRASHER, sqlite_url, str(spool), request_id, str(tid)],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.strip() == "recorded"
        proc.send_signal(signal.SIGKILL)  # no close(), no flush, no atexit
        await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await _count(db) == (0, 0)  # the dead process never wrote it to the database
    assert [p.suffix for p in spool.iterdir() if p.is_file()] == [".journal"]

    writer = UsageWriter(db.url, spool, flush_interval_s=0.05)
    await writer.start()
    try:
        assert await writer.flush()  # adopts the dead process's journal
        assert await writer.flush()
        async with db.sessionmaker() as s:
            row = (await s.execute(select(UsageRecord).where(UsageRecord.request_id == request_id))).scalar_one()
        assert (row.prompt_tokens, row.completion_tokens, row.cost_usd) == (3, 4, Decimal("0.5"))
        assert await _count(db) == (1, 1)
        # nothing left but this writer's spare journal (made ready by its flush; never holds rows)
        assert [p.suffix for p in spool.iterdir() if p.is_file()] == [".new"]
    finally:
        await writer.close()
        await db.dispose()


async def test_live_journal_of_a_running_writer_is_not_adopted(sqlite_url, tmp_path):
    """Another writer on the same spool must not seal a journal whose owner is alive (flock)."""
    db = Database(sqlite_url)
    tid = await _add_tenant(db)
    owner = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=3600)
    other = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=3600)
    await owner.start()
    await other.start()
    try:
        events = _events(tid, 3)
        for e in events:
            owner.record(e)
        assert await other.flush()  # sees the live journal, leaves it alone
        assert await _count(db) == (0, 0) and owner.pending == 3
        assert await owner.flush()
        assert await _count(db) == (3, 3)
    finally:
        await owner.close()
        await other.close()
        await db.dispose()


async def test_two_writers_on_one_spool_lose_and_duplicate_nothing(sqlite_url, tmp_path):
    """Journals are rotated often while another writer keeps adopting orphans in the same spool:
    a live journal is never taken from its owner, every row lands once."""
    db = Database(sqlite_url)
    tid = await _add_tenant(db)
    a = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=0.01, batch_size=20)
    b = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=0.01, batch_size=20)
    await a.start()
    await b.start()
    try:
        events = _events(tid, 600)
        for i in range(0, 600, 30):
            for e in events[i:i + 15]:
                a.record(e)
            for e in events[i + 15:i + 30]:
                b.record(e)
            await asyncio.sleep(0.003)
    finally:
        await a.close()
        await b.close()
    try:
        assert await _count(db) == (600, 600)
        assert not [p for p in (tmp_path / "spool").iterdir() if p.is_file()]
    finally:
        await db.dispose()


async def test_a_full_journal_rolls_over_and_loses_nothing(sqlite_url, tmp_path):
    """Rows are copied into a mapped journal of fixed size: when one is full, the next row starts
    another, and the next flush seals both."""
    db = Database(sqlite_url)
    tid = await _add_tenant(db)
    writer = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=3600, batch_size=10_000, journal_bytes=4096)
    await writer.start()
    try:
        events = _events(tid, 60)  # ~400 bytes a row: six journals or so
        for e in events:
            writer.record(e)
        assert writer.pending == 60
        journals = [p for p in (tmp_path / "spool").iterdir() if p.suffix == ".journal"]
        assert len(journals) > 3 and all(p.stat().st_size == 4096 for p in journals)  # reserved up front
        assert await writer.flush()
        assert await _count(db) == (60, 60)
        assert writer.files_spooled == len(journals)
    finally:
        await writer.close()
        await db.dispose()
    assert not [p for p in (tmp_path / "spool").iterdir() if p.is_file()]


async def test_spare_journals_are_kept_while_their_owner_lives_and_dropped_after(sqlite_url, tmp_path):
    """The writer thread makes the next journal ready (``.new``, no rows). Another process's
    flush leaves a live writer's spare alone (flock) and removes one whose owner is gone."""
    db = Database(sqlite_url)
    await _add_tenant(db)
    spool = tmp_path / "spool"
    owner = UsageWriter(db.url, spool, flush_interval_s=3600)
    other = UsageWriter(db.url, spool, flush_interval_s=3600)
    await owner.start()
    await other.start()
    try:
        await owner.flush()
        spares = [p for p in spool.iterdir() if p.suffix == ".new"]
        assert len(spares) == 2  # one each, made ready when they started
        dead = spool / "00000000000000000001-1-000000.new"  # a spare left by a dead process
        dead.write_bytes(b"\0" * 4096)
        young = spool / "00000000000000000002-2-000000.new"  # unlocked, but it may be being made now
        young.write_bytes(b"")
        os.utime(dead, (time.time() - 3600, time.time() - 3600))
        await other.flush()
        assert all(p.exists() for p in spares) and not dead.exists() and young.exists()
        young.unlink()
    finally:
        await owner.close()
        await other.close()
        await db.dispose()
    assert not [p for p in spool.iterdir() if p.is_file()]


def test_a_failed_spool_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Found by QA: with the spool's disk full, a write failed after creating its ``.tmp`` file,
    which then stayed for good (the replay ignores ``.tmp`` files)."""
    import errno

    from gateway import usage_journal

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(usage_journal.os, "fsync", full)
    with pytest.raises(OSError):
        usage_journal.write_durably(tmp_path / "spool" / "rows.jsonl", '{"a": 1}\n')
    assert list((tmp_path / "spool").iterdir()) == []


async def test_a_full_disk_is_one_log_line_without_a_traceback_and_loses_no_row(sqlite_url, tmp_path, monkeypatch,
                                                                                caplog):
    """Found by QA: a full spool disk logged a whole traceback per 10 s, where the README promises one
    line naming the reason. The rows wait in memory and are journaled once the disk takes them."""
    import errno
    import logging

    db = Database(sqlite_url)
    tid = await _add_tenant(db)
    writer = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=3600)
    await writer.start()
    try:
        events = _events(tid, 3)
        writer.record(events[0])  # (opens the journal)

        def full(_journal: object, _data: bytes) -> bool:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(type(writer._journal), "append", full)
        with caplog.at_level(logging.ERROR, logger="gateway.usage"):
            writer.record(events[1])
            writer.record(events[2])
        (line,) = [r for r in caplog.records if "cannot append to the journal" in r.getMessage()]
        assert not line.exc_info and "No space left on device" in line.getMessage()
        monkeypatch.undo()  # the disk has room again
        assert await writer.flush()
        assert await _count(db) == (3, 3)
    finally:
        await writer.close()
        await db.dispose()


async def test_rows_the_full_spool_cannot_take_go_straight_to_the_database(sqlite_url, tmp_path, monkeypatch,
                                                                           caplog):
    """Found by QA: with the spool's disk full and the database up, rows never reached the database,
    and a clean stop lost 8 of 10 of them while logging that they "stay spooled". Rows that live only
    in memory now go straight into the database, at every flush and at the stop."""
    import logging

    from gateway import usage

    db = Database(sqlite_url)
    tid = await _add_tenant(db)
    writer = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=3600)
    await writer.start()
    events = _events(tid, 10)
    writer.record(events[0])  # (opens the journal)
    monkeypatch.setattr(type(writer._journal), "append", _disk_full)
    monkeypatch.setattr(usage, "write_durably", _disk_full)
    with caplog.at_level(logging.WARNING, logger="gateway.usage"):
        for event in events[1:5]:
            writer.record(event)
        assert await writer.flush()  # the four in memory are in the database, the journaled one too
        assert await _count(db) == (5, 5)
        for event in events[5:]:
            writer.record(event)
        await writer.close()  # a clean stop with the disk still full
    assert await _count(db) == (10, 10)
    assert any("written straight to the database" in r.getMessage() for r in caplog.records)
    assert not any("stay spooled" in r.getMessage() or r.exc_info for r in caplog.records)
    await db.dispose()


async def test_rows_neither_the_spool_nor_the_database_take_are_reported_lost_at_the_stop(tmp_path, monkeypatch,
                                                                                          caplog):
    """The stop's log says what happened to rows only in memory: lost, by count (it used to say they
    stay spooled, with a traceback)."""
    import logging

    from gateway import usage

    # a database nobody listens on (port 1): every insert fails at once
    writer = UsageWriter("postgresql+asyncpg://postgres@127.0.0.1:1/none", tmp_path / "spool",
                         flush_interval_s=3600, db_timeout_s=1.0)
    await writer.start()
    monkeypatch.setattr(usage.Journal, "append", _disk_full)
    monkeypatch.setattr(usage, "write_durably", _disk_full)
    for event in _events(1, 3):
        writer.record(event)
    with caplog.at_level(logging.WARNING, logger="gateway.usage"):
        await writer.close()
    (line,) = [r for r in caplog.records if "are lost" in r.getMessage()]
    assert line.levelno == logging.ERROR and "3 row(s)" in line.getMessage() and not line.exc_info


async def test_a_flush_that_may_not_retry_the_database_gives_up_right_after_a_failure(tmp_path):
    """A quota rebuild's flush (``retry_db=False``): right after an insert failed, it answers False
    without trying the database again (found by QA: with PostgreSQL hung, the rebuild waited out
    the background insert, then its own, 10-12 s before its 503). A plain flush still tries."""
    from gateway import usage

    writer = UsageWriter("postgresql+asyncpg://postgres@127.0.0.1:1/none", tmp_path / "spool",
                         flush_interval_s=3600, db_timeout_s=1.0)
    await writer.start()
    tried = []
    real = writer._insert

    async def insert(rows: list, path: object) -> None:
        tried.append(len(rows))
        await real(rows, path)

    writer._insert = insert
    try:
        for event in _events(1, 3):
            writer.record(event)
        assert not await writer.flush()  # the database is down: tried, failed, backing off
        assert tried == [3]
        assert not await writer.flush(retry_db=False)
        assert tried == [3]  # not tried again
        assert not await writer.flush()
        assert tried == [3, 3]
        # a second after the failure it tries again, though the backoff (2 s by now) has not ended:
        # the database may be back (a recheck QA: 503s for 8.6 s after it returned)
        await asyncio.sleep(usage.FRESH_FAILURE_S + 0.05)
        assert not await writer.flush(retry_db=False)
        assert tried == [3, 3, 3]
    finally:
        await writer.close()


async def test_a_rebuild_flush_with_a_full_spool_writes_the_rows_a_second_after_a_failure(sqlite_url, tmp_path,
                                                                                          monkeypatch):
    """Rows only in memory (the spool's disk full) follow the same rule as spooled ones for a flush
    that may not retry the database: given up within ``FRESH_FAILURE_S`` of a failed insert, tried
    after it, whatever the writer's own backoff (which grows to 10 s)."""

    from gateway import usage

    db = Database(sqlite_url)
    tid = await _add_tenant(db)
    writer = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=3600)
    await writer.start()
    try:
        monkeypatch.setattr(usage.Journal, "append", _disk_full)
        monkeypatch.setattr(usage, "write_durably", _disk_full)
        for event in _events(tid, 3):
            writer.record(event)
        writer._db_failed(TimeoutError())  # an insert has just failed (the backoff: 3600 s here)
        with pytest.raises(OSError):
            await writer.flush(retry_db=False)
        assert await _count(db) == (0, 0)
        await asyncio.sleep(usage.FRESH_FAILURE_S + 0.05)
        assert await writer.flush(retry_db=False)  # the database answers: the rows are in
        assert await _count(db) == (3, 3)
    finally:
        await writer.close()
        await db.dispose()


@pytest.mark.parametrize("tracked", [10_000, 1])
async def test_rows_another_writer_put_in_the_database_count_as_written(sqlite_url, tmp_path, monkeypatch, tracked):
    """Found by a re-check QA (``--workers 2``, Redis restarted under load): a quota rebuild takes
    ``written`` as this process's rows in its sum, but another worker's flush had inserted this
    one's sealed spool files, so those requests were charged again (counters 79-606 tokens over the
    rows). ``written_anywhere`` counts the rows of this process's sealed files that are gone (with
    ``tracked`` 1, the files of later flushes join the newest entry)."""
    from gateway import usage as usage_module

    monkeypatch.setattr(usage_module, "SEALED_TRACKED", tracked)
    db = Database(sqlite_url)
    tid = await _add_tenant(db)
    owner = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=0.05, db_interval_s=3600)
    other = UsageWriter(db.url, tmp_path / "spool", flush_interval_s=3600)
    await owner.start()
    await other.start()
    try:
        assert await owner.flush()  # (the first pass sets the insert clock going)
        for e in _events(tid, 4, "a"):
            owner.record(e)
        for _ in range(100):  # sealed by the owner's own flushes, not inserted (the hour's interval)
            if owner.spooled_files():
                break
            await asyncio.sleep(0.02)
        assert owner.written_anywhere() == 0 and await _count(db) == (0, 0)
        for e in _events(tid, 2, "b"):  # recorded after: in the live journal, not sealed yet
            owner.record(e)
        assert await other.flush()  # the other process writes the spool, the owner's sealed file too
        assert await _count(db) >= (4, 4)
        assert owner.written == 0 and owner.written_anywhere() >= 4  # (6 if its flush sealed the "b" rows too)
    finally:
        await owner.close()
        await other.close()
        await db.dispose()
