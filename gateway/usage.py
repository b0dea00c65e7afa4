"""Usage rows: one per request, recorded without ever waiting on the database.

``record(event)`` copies the row, one JSON line, into this process's *journal*: a file mapped into
memory (``mmap``, ``MAP_SHARED``, its blocks reserved up front with ``posix_fallocate``), so the
copy is a memcpy into the kernel's page cache, with no system call (no fsync): once it returns, the
row is in the page cache and survives a crash of the process. A ``write`` would do the same but
releases the GIL, and getting it back from a busy engine thread costs the event loop up to the
GIL switch interval (~0.3 ms measured) per row. Every ``flush_interval_s`` (or as
soon as ``batch_size`` rows wait) the journal is rotated and handed to the writer's own thread,
which has its own event loop and database engine, so neither fsync nor SQLAlchemy's per-row work
ever runs on the gateway's event loop. There:

1. the journal ``<spool>/<time>-<pid>-<seq>.journal`` is renamed to ``….jsonl`` and fsynced
   (with its directory): a ``.jsonl`` file is a sealed spool file;
2. journals of dead processes are adopted the same way: a journal is ``flock``-ed by its owner
   while open, so a journal whose lock can be taken has no living owner (a SIGKILLed gateway's
   rows are written by the next flush of any process sharing the spool directory);
3. every ``db_interval_s`` (or as soon as ``batch_size`` sealed rows wait, or on ``flush()``),
   the spool's files, oldest first, are inserted into ``usage_records`` with
   INSERT … ON CONFLICT (request_id) DO NOTHING (SQLite and PostgreSQL), each file deleted once
   its rows are in; ``api_keys.last_used_at`` moves forward in the same transaction.

If the database is down the files stay and are retried with backoff; a restarted process (or any
other process sharing the spool directory) replays them. ``request_id`` is unique, so a replay
after a crash between insert and delete never duplicates a row. Rows the database rejects for good
(e.g. a deleted tenant) and unreadable files are moved to ``<spool>/rejected/`` instead of
blocking the spool; a torn last line (power loss mid-write) is skipped. Durability: a row survives
a process crash as soon as ``record`` returns, and a power loss within one flush interval."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import logging
import math
import os
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, or_
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db.models import ApiKey, UsageRecord
from gateway.log_throttle import LogThrottle
from gateway.private import private_dir
from gateway.probes import Outage
from gateway.usage_journal import (
    JOURNAL_BYTES,
    JOURNAL_SUFFIX,
    Journal,
    adopt_orphans,
    set_aside,
    write_durably,
)

log = logging.getLogger(__name__)

FRESH_FAILURE_S = 1.0  # a flush that may not retry the database gives up this long after a failed insert


@dataclass(slots=True)
class UsageEvent:
    """Mirrors ``UsageRecord`` (without the surrogate id)."""

    request_id: str
    tenant_id: int
    model: str
    status: str  # ok | error | aborted | ...
    created_at: datetime | None = None  # None: when the row is written
    api_key_id: int | None = None
    endpoint: str = "chat.completions"
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    saved_usd: Decimal = Decimal(0)
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    finish_reason: str | None = None
    cache: str = "miss"  # hit | semantic-hit | miss | bypass
    # the row's time as integer microseconds since the epoch, UTC, when it is already known as such
    # (a request's quota reservation: the instant that picked its budget period); wins over created_at
    created_us: int | None = None

    def to_json(self) -> str:
        """One JSON object on one line, by one ``%`` format (``json.dumps`` of a dict costs ~3x as
        much on the request path; ``asdict`` deep-copies every value, ~0.1 ms a row). The time is
        integer microseconds since the epoch, UTC (``created_us``; ``isoformat`` alone cost a third
        of the row); ``_row_from_json`` also reads the ISO ``created_at`` of older journals."""
        created, us = self.created_at, self.created_us
        if us is None:
            us = time.time_ns() // 1000 if created is None else (created.astimezone(UTC) - EPOCH) // MICROSECOND
        return _ROW % (_str(self.request_id), self.tenant_id, _str(self.model), _str(self.status), us,
                       _opt_int(self.api_key_id), _str(self.endpoint), self.prompt_tokens, self.cached_prompt_tokens,
                       self.completion_tokens, self.cost_usd, self.saved_usd, _float(self.latency_ms),
                       _opt_float(self.ttft_ms), _opt_str(self.finish_reason), _str(self.cache))


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
_ROW = ('{"request_id":%s,"tenant_id":%d,"model":%s,"status":%s,"created_us":%d,"api_key_id":%s,"endpoint":%s,'
        '"prompt_tokens":%d,"cached_prompt_tokens":%d,"completion_tokens":%d,"cost_usd":"%s","saved_usd":"%s",'
        '"latency_ms":%s,"ttft_ms":%s,"finish_reason":%s,"cache":%s}')
_str = json.encoder.encode_basestring_ascii  # the C escaper json.dumps uses


def _opt_str(value: str | None) -> str:
    return "null" if value is None else _str(value)


def _opt_int(value: int | None) -> str:
    return "null" if value is None else str(int(value))


def _float(value: float) -> str:
    value = float(value)
    return repr(value) if math.isfinite(value) else json.dumps(value)  # (as json.dumps wrote it)


def _opt_float(value: float | None) -> str:
    return "null" if value is None else _float(value)


def _rejected(exc: DBAPIError) -> bool:
    """A row the database will never take: the row is bad, not the database. PostgreSQL's data and
    integrity errors (SQLSTATE classes 22 and 23: a value too long, a NUL byte, a number out of
    range) reach SQLAlchemy's asyncpg dialect as plain ``DBAPIError`` (found by QA: one status of
    40 characters blocked every later row, and every counter rebuild after it)."""
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return isinstance(exc, IntegrityError | DataError) or (isinstance(code, str) and code[:2] in ("22", "23"))


_COLUMNS = {f.name for f in fields(UsageEvent)} - {"created_us"}


def _row_from_json(line: str) -> dict:
    d = json.loads(line)
    row = {k: v for k, v in d.items() if k in _COLUMNS}
    us = d.get("created_us")
    row["created_at"] = (EPOCH + us * MICROSECOND if us is not None
                         else datetime.fromisoformat(d["created_at"]).astimezone(UTC))
    row["cost_usd"], row["saved_usd"] = Decimal(row["cost_usd"]), Decimal(row["saved_usd"])
    return row


def _insert_ignore(dialect: str):  # noqa: ANN202 - an Insert construct
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        raise NotImplementedError(f"usage writer supports sqlite and postgresql, not {dialect}")
    return insert(UsageRecord).on_conflict_do_nothing(index_elements=["request_id"])


SEALED_TRACKED = 10_000  # sealed spool files tracked one by one for ``written_anywhere``, at most

class UsageWriter:
    """``record(event)`` (sync, never blocks on the database, never raises); ``await flush()``;
    ``await close()`` drains. ``start()`` launches the writer thread; its first flush replays
    what earlier runs left in the spool."""

    def __init__(self, database_url: str, spool_dir: str | Path, *, flush_interval_s: float = 0.5,
                 batch_size: int = 500, max_backoff_s: float = 10.0,
                 journal_bytes: int = JOURNAL_BYTES, db_interval_s: float | None = None,
                 db_timeout_s: float = 5.0) -> None:
        self._url = database_url
        self._spool = Path(spool_dir)
        self._rejected = self._spool / "rejected"
        self._interval = flush_interval_s
        # how often sealed rows go into the database (None: every flush); a batch_size of them
        # waiting goes at once. Sealing (the durability) stays every flush interval.
        self._db_interval = flush_interval_s if db_interval_s is None else db_interval_s
        self._next_insert = 0.0  # monotonic time before which spooled rows wait (unless forced)
        self._spooled_rows = 0  # rows sealed into the spool since the last database pass
        self._batch_size = batch_size
        self._db_timeout_s = db_timeout_s  # PostgreSQL's connects and statements (PAGEGATE_DATABASE_TIMEOUT_S)
        self._journal_bytes = journal_bytes
        self._max_backoff = max_backoff_s
        self._journal: Journal | None = None  # where record() appends now
        self._full: list[Journal] = []  # journals that filled up before the next flush
        self._spare: Journal | None = None  # the next journal, made ready by the writer thread
        self._unjournaled: list[str] = []  # lines record() could not write (disk trouble)
        # rows recorded by this process so far, and how many of the first of them are surely in the
        # database (a flush that left the spool empty): a quota rebuild's sum holds those
        self.recorded = 0
        self.written = 0
        # this process's sealed spool files, oldest first, each with the rows recorded when it was
        # rotated: another process sharing the spool may write them to the database (``written_anywhere``)
        self._sealed: list[tuple[list[Path], int]] = []
        self._unjournaled_log = LogThrottle()  # one error per spell of disk trouble, not one per row
        # the writer's own disk trouble (a full spool disk): one line per 10 s, no traceback (found
        # by QA: a traceback every 0.5 s)
        self._spare_log = LogThrottle()
        self._writer_log = LogThrottle()
        # a failed insert: the writer's own retries back off to 10 s, but flushes others ask for (each
        # quota rebuild, once a second per tenant while the database is down) come on top (found by QA)
        self._db_down_log = LogThrottle(5.0)
        self._jlock = threading.Lock()  # record() vs rotation, whatever thread calls record()
        self._spool_ready = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None  # one flush at a time in this process
        self._stopping = False
        self._worker: _WorkerLoop | None = None
        self._engine: AsyncEngine | None = None  # lives on the worker loop only
        self._seq = itertools.count()
        self._db_ok_after = 0.0  # monotonic time before which DB writes are not retried
        self._db_failed_at = -math.inf  # monotonic time of the last failed insert
        self._backoff = flush_interval_s
        self._db_outage = Outage()  # the database as the inserts last found it (``database_state``)
        self.rows_written = 0  # rows the DB accepted from this process (duplicates excluded)
        self.files_spooled = 0  # journals this process sealed into spool files

    # -- public (gateway event loop) --------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        self._wake, self._lock, self._stopping = asyncio.Event(), asyncio.Lock(), False
        self._worker = _WorkerLoop()
        await self._worker.run(self._w_open())
        self._task = asyncio.create_task(self._run(), name="usage-writer")

    def record(self, event: UsageEvent) -> None:
        """Append one row to the journal (page cache: survives a process crash). Never raises:
        if the disk refuses the write the line is kept in memory for the next flush."""
        line = event.to_json() + "\n"
        with self._jlock:
            self.recorded += 1
            try:
                data = line.encode()
                journal = self._journal or self._open_journal()
                if not journal.append(data):  # full: hand it to the next flush, go on in a new one
                    self._full.append(journal)
                    journal = self._open_journal()
                    if not journal.append(data):
                        raise OSError(f"a usage row of {len(data)} bytes does not fit a journal")
                waiting = journal.count
            except OSError as exc:  # (its reason in the line, no traceback: a QA find)
                self._unjournaled_log.log(log, logging.ERROR, "usage: cannot append to the journal (%s); rows kept "
                                          "in memory until the spool is writable or the next flush writes them to "
                                          "the database (lost if the process dies first)", exc)
                self._unjournaled.append(line)
                waiting = len(self._unjournaled)
        if waiting >= self._batch_size and self._wake is not None:
            self._wake.set()

    async def flush(self, *, retry_db: bool = True) -> bool:
        """Seal the journal and try to write the whole spool to the database now.
        Returns True when the spool is empty afterwards (everything is in the database).
        ``retry_db=False``: when an insert failed less than ``FRESH_FAILURE_S`` ago (the one this
        call waited for, say), give up at once instead of trying it again (a quota rebuild's flush:
        found by QA, it waited out a hung insert and then its own, 10-12 s). Not for the whole
        backoff, which grows to 10 s: the database may be back well before it ends (a recheck QA:
        budget tenants got 503s for 8.6 s after it returned)."""
        if self._worker is None:
            raise RuntimeError("UsageWriter.start() first")
        async with self._lock:
            return await self._flush_locked(force=True, retry_db=retry_db)

    async def close(self) -> None:
        """Stop the flusher, seal the journal, try one last database write, stop the thread.
        Whatever the database did not take stays spooled for the next start."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
        if self._worker is not None:
            try:
                await self.flush()
            except Exception as exc:  # (found by QA: a traceback, and "stay spooled" of rows only in memory)
                lost = len(self._unjournaled)
                if lost:
                    log.error("usage: %d row(s) could be written neither to the spool (%s) nor to the database; "
                              "they are lost with this process", lost, exc)
                else:
                    log.warning("usage: final flush failed (%s: %s); rows stay spooled in %s and are written at "
                                "the next start", type(exc).__name__, exc, self._spool)
            with contextlib.suppress(Exception):
                await self._worker.run(self._w_close())
            await asyncio.to_thread(self._worker.stop)
            self._worker = None
        with self._jlock:  # never started, or the worker is gone: the journal stays for adoption
            for journal in (*self._full, self._journal):
                if journal is not None:
                    journal.close()
            if self._spare is not None:
                self._spare.discard()  # never written to
            self._full, self._journal, self._spare = [], None, None

    def written_anywhere(self) -> int:
        """How many of this process's first rows are surely in the database: ``written``, or more
        where the spool files it sealed are gone, inserted by another process sharing the spool
        (each file is deleted only once its rows are in). A quota rebuild's sum read after this
        holds those rows; without them it counted again, as not in the sum, the requests of the
        rebuilding process whose rows another worker had written (found by a re-check QA with
        ``--workers 2``: counters 79-606 tokens over the rows in 5 of 49 Redis restarts). (A file set
        aside in ``rejected/`` counts too: its rows are in no sum, and their requests go uncharged.)"""
        while self._sealed:
            paths, mark = self._sealed[0]
            if any(path.exists() for path in paths):
                break
            self.written = max(self.written, mark)
            self._sealed.pop(0)
        return self.written

    @property
    def pending(self) -> int:
        """Rows recorded but not yet handed to the writer thread."""
        return ((self._journal.count if self._journal else 0) + sum(j.count for j in self._full)
                + len(self._unjournaled))

    def database_state(self) -> dict:
        """What ``/health`` and ``/metrics`` say of the database, as this writer last found it:
        ``unavailable`` from a failed insert until one succeeds (so an idle process reports the
        last outcome, not a fresh probe), with the error, for how long, and the rows this process
        recorded that are not yet known to be in the database (normally up to the insert
        interval's worth). No I/O: cheap enough for the event loop."""
        return {**self._db_outage.state(), "rows_waiting": max(0, self.recorded - self.written)}

    def spool_file_count(self) -> int | None:
        """The spool's files waiting for the database (every process's, orphans included); None
        when the directory cannot be listed. Lists a directory: call it off the event loop."""
        try:
            return len(self.spooled_files())
        except OSError:
            return None

    def spooled_files(self) -> list[Path]:
        if not self._spool.is_dir():
            return []
        return sorted(p for p in self._spool.iterdir() if p.suffix == ".jsonl" and p.is_file())

    async def _run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            if self._stopping:
                return
            try:
                async with self._lock:
                    await self._flush_locked(force=False)
            except OSError as exc:  # disk trouble (full, read-only): rows are back in memory meanwhile
                self._writer_log.log(log, logging.ERROR, "usage writer: cannot write the spool: %s; rows "
                                     "stay in memory and are tried again", exc)
            except Exception:  # never let the writer die; rows are on disk or back in memory
                log.exception("usage writer: unexpected error")

    def _open_journal(self) -> Journal:
        """The spare journal the writer thread made ready (one rename here), else a new one."""
        journal, self._spare = self._spare, None
        if journal is not None:
            try:
                journal.reveal()
            except OSError:
                journal.discard()
                journal = None
        self._journal = journal or self._new_journal()
        return self._journal

    def _new_journal(self, *, reveal: bool = True) -> Journal:
        if not self._spool_ready:
            private_dir(self._spool)
            self._spool_ready = True
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}{JOURNAL_SUFFIX}"
        return Journal.create(self._spool / name, self._journal_bytes, reveal=reveal)

    def _rotate(self) -> tuple[list[Journal], list[str]]:
        with self._jlock:
            journals = [*self._full, *([self._journal] if self._journal is not None else [])]
            self._full, self._journal = [], None
            lines, self._unjournaled = self._unjournaled, []
        return journals, lines

    def _prepare_spare(self) -> None:
        """Writer thread: open the next journal ahead, so record() never makes a system call."""
        if self._spare is not None or self._stopping:
            return
        try:
            spare = self._new_journal(reveal=False)
            spare.prefault()
        except OSError as exc:
            self._spare_log.log(log, logging.WARNING, "usage: cannot prepare the next journal: %s", exc)
            return
        with self._jlock:
            if self._spare is None and not self._stopping:
                self._spare, spare = spare, None
        if spare is not None:
            spare.discard()

    async def _flush_locked(self, *, force: bool, retry_db: bool = True) -> bool:
        mark = self.recorded  # (the rows up to here are in what is rotated now)
        journals, lines = self._rotate()
        on_disk: list[bool] = []  # the worker appends True once the in-memory lines are in a file
        sealed: list[Path] = []  # the spool files this flush made of the rows up to ``mark``
        try:
            empty = await self._worker.run(self._w_flush(journals, lines, force, on_disk, retry_db, sealed))
            if empty:
                self.written = max(self.written, mark)
                self._sealed.clear()
            elif sealed:
                if len(self._sealed) >= SEALED_TRACKED:  # (a long outage: the newest entry takes these files too)
                    paths, _ = self._sealed.pop()
                    sealed = paths + sealed
                self._sealed.append((sealed, mark))
            return empty
        except BaseException:
            if lines and not on_disk:
                with self._jlock:
                    self._unjournaled[:0] = lines  # not on disk: keep them for the next try
            raise

    # -- worker thread (its own event loop and engine) ---------------------------------------------

    async def _w_open(self) -> None:
        from gateway.db.session import Database

        private_dir(self._spool)
        self._engine = Database(self._url, timeout_s=self._db_timeout_s).engine
        self._prepare_spare()

    async def _w_close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()

    async def _w_flush(self, journals: list[Journal], lines: list[str], force: bool,
                       on_disk: list[bool], retry_db: bool = True, sealed: list[Path] | None = None) -> bool:
        sealed = [] if sealed is None else sealed
        for journal in journals:
            if journal.count:
                self._spooled_rows += journal.count
                journal.seal()
                sealed.append(journal.path.with_suffix(".jsonl"))
                self.files_spooled += 1
            else:
                journal.discard()
        self._prepare_spare()
        if lines:
            name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}.jsonl"
            try:
                write_durably(self._spool / name, "".join(lines))
                sealed.append(self._spool / name)
                self.files_spooled += 1
                self._spooled_rows += len(lines)
            except OSError as exc:  # the spool's disk refuses them (full): the database is the one other
                await self._insert_unspooled(lines, name, exc, force, retry_db)  # place they survive (QA)
            on_disk.append(True)
        adopt_orphans(self._spool)
        now = time.monotonic()
        if not force and (now < self._db_ok_after
                          or (now < self._next_insert and self._spooled_rows < self._batch_size)):
            return False
        if self._db_paused(force, retry_db) and self.spooled_files():
            return False
        for path in self.spooled_files():
            try:
                rows = _read_rows(path)
            except FileNotFoundError:
                continue  # another process replayed it
            except (ValueError, KeyError, TypeError):  # not ours / damaged: set aside, keep going
                log.error("usage: unreadable spool file %s moved to %s", path.name, self._rejected)
                set_aside(path, self._rejected)
                continue
            try:
                await self._insert(rows, path)
            except Exception as exc:  # database unreachable / down / timing out: keep the file
                retry_s = self._backoff
                self._db_failed(exc)
                waiting = len(self.spooled_files())
                if self._stopping:
                    self._db_down_log.reset()  # the last word is always written
                self._db_down_log.log(
                    log, logging.WARNING, "usage: database unavailable (%s); %d spool file%s stay%s (%d rows in the "
                    "oldest), %s", self._db_outage.error, waiting, "" if waiting == 1 else "s",
                    "s" if waiting == 1 else "", len(rows),
                    f"written at the next start (in {self._spool})" if self._stopping  # (QA: it said "retry in
                    else f"next retry in {retry_s:.1f}s")  # 8.0s" as the process exited)
                return False
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._backoff = self._interval
        self._db_ok_after = 0.0
        self._spooled_rows = 0
        self._next_insert = time.monotonic() + self._db_interval
        self._db_reached()
        self._db_down_log.reset()
        return True

    def _db_paused(self, force: bool, retry_db: bool) -> bool:
        """Whether this pass leaves the database alone: an unforced one while it backs off after a
        failed insert, one that may not retry it (``retry_db=False``) within ``FRESH_FAILURE_S``."""
        now = time.monotonic()
        return (not force and now < self._db_ok_after) or (not retry_db and now - self._db_failed_at < FRESH_FAILURE_S)

    def _db_failed(self, exc: BaseException) -> None:
        """An insert failed: back off, twice as long each time up to ``max_backoff_s``."""
        self._db_outage.failed(exc, timeout_s=self._db_timeout_s)
        self._db_failed_at = time.monotonic()
        self._db_ok_after = self._db_failed_at + self._backoff
        self._backoff = min(self._max_backoff, self._backoff * 2)

    async def _insert_unspooled(self, lines: list[str], name: str, exc: OSError, force: bool,
                                retry_db: bool) -> None:
        """Rows that live only in memory because the spool cannot be written go straight into the
        database (a clean stop with a full spool disk lost 8 of 10 rows while the database was up:
        found by QA). Raises ``exc`` when the database cannot take them either (or is backing off):
        the caller keeps them in memory for the next try. A later replay of rows that did get in is a
        no-op (``request_id`` is unique)."""
        if self._db_paused(force, retry_db):
            raise exc
        try:
            await self._insert([_row_from_json(line) for line in lines], self._spool / name)
        except Exception as db_exc:
            self._db_failed(db_exc)
            raise exc from db_exc
        self._db_reached()
        self._writer_log.log(log, logging.WARNING, "usage: the spool cannot be written (%s); %d row(s) were "
                             "written straight to the database", exc, len(lines))

    def _db_reached(self) -> None:
        down_s = self._db_outage.reached()
        if down_s is not None:  # (found by QA: no line said the database was back)
            log.warning("usage: the database is reachable again after %.1f s; the rows waiting for it are "
                        "written", down_s)

    async def _insert(self, rows: list[dict], path: Path) -> None:
        if not rows:
            return
        stmt = _insert_ignore(self._engine.dialect.name)
        try:
            async with self._engine.begin() as conn:
                result = await conn.execute(stmt, rows)
                await _touch_keys(conn, rows)
            self.rows_written += max(0, result.rowcount or 0)
        except DBAPIError as exc:
            if not _rejected(exc):
                raise
            await self._insert_one_by_one(rows, path)  # (a row the database will never take: isolate it)

    async def _insert_one_by_one(self, rows: list[dict], path: Path) -> None:
        stmt = _insert_ignore(self._engine.dialect.name)
        bad: list[dict] = []
        for row in rows:
            try:
                async with self._engine.begin() as conn:
                    result = await conn.execute(stmt, [row])
                self.rows_written += max(0, result.rowcount or 0)
            except DBAPIError as exc:
                if not _rejected(exc):
                    raise
                log.error("usage: row %s rejected by the database: %s", row.get("request_id"), exc.orig)
                bad.append(row)
        if bad:
            write_durably(self._rejected / path.name, "".join(json.dumps(r, default=str) + "\n" for r in bad))


class _WorkerLoop:
    """A daemon thread running its own asyncio loop; ``await run(coro)`` from the gateway loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="usage-writer", daemon=True)
        self._thread.start()

    async def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        fut: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        # shield: cancelling the caller must not cancel a half-done insert on the worker loop
        return await asyncio.shield(asyncio.wrap_future(fut))

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()



_KEYS = ApiKey.__table__
_TOUCH = (_KEYS.update()
          .where(_KEYS.c.id == bindparam("kid"))
          .where(or_(_KEYS.c.last_used_at.is_(None), _KEYS.c.last_used_at < bindparam("ts")))
          .values(last_used_at=bindparam("ts")))


async def _touch_keys(conn, rows: list[dict]) -> None:  # noqa: ANN001 - AsyncConnection
    """Move ``api_keys.last_used_at`` forward to the newest row of each key in the batch."""
    newest: dict[int, datetime] = {}
    for row in rows:
        kid = row.get("api_key_id")
        if kid is not None and (kid not in newest or row["created_at"] > newest[kid]):
            newest[kid] = row["created_at"]
    if newest:
        await conn.execute(_TOUCH, [{"kid": k, "ts": ts} for k, ts in newest.items()])



def _read_rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.rstrip("\0").split("\n")  # (a journal's reserved zeros are cut off before)
    if lines[-1].strip():  # no newline at the end: a write torn by a power loss
        log.warning("usage: %s ends with a torn line; skipped: %.80s", path.name, lines[-1])
    return [_row_from_json(line) for line in lines[:-1] if line.strip()]
