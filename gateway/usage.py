"""Usage rows: one per request, recorded without ever waiting on the database.

``record(event)`` appends the row as one JSON line to this process's *journal* with a plain
``os.write`` on an ``O_APPEND`` descriptor (microseconds, no fsync): once it returns, the row is in
the kernel's page cache and survives a crash of the process. Every ``flush_interval_s`` (or as
soon as ``batch_size`` rows wait) the journal is rotated and handed to the writer's own thread,
which has its own event loop and database engine, so neither fsync nor SQLAlchemy's per-row work
ever runs on the gateway's event loop. There:

1. the journal ``<spool>/<time>-<pid>-<seq>.journal`` is renamed to ``….jsonl`` and fsynced
   (with its directory): a ``.jsonl`` file is a sealed spool file;
2. journals of dead processes are adopted the same way: a journal is ``flock``-ed by its owner
   while open, so a journal whose lock can be taken has no living owner (a SIGKILLed gateway's
   rows are written by the next flush of any process sharing the spool directory);
3. the spool's files, oldest first, are inserted into ``usage_records`` with
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
import fcntl
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import bindparam, or_
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db.models import ApiKey, UsageRecord

log = logging.getLogger(__name__)


@dataclass(slots=True)
class UsageEvent:
    """Mirrors ``UsageRecord`` (without the surrogate id)."""

    request_id: str
    tenant_id: int
    model: str
    status: str  # ok | error | aborted | ...
    created_at: datetime | None = None  # request start, UTC; None: now
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

    def to_json(self) -> str:
        # a flat copy of the fields: ``asdict`` deep-copies every value (~0.1 ms a row)
        d = {name: getattr(self, name) for name in _EVENT_FIELDS}
        created = self.created_at or datetime.now(UTC)
        d["created_at"] = created.astimezone(UTC).isoformat()
        d["cost_usd"], d["saved_usd"] = str(self.cost_usd), str(self.saved_usd)
        return json.dumps(d, separators=(",", ":"))


_EVENT_FIELDS = tuple(f.name for f in fields(UsageEvent))
_REJECTED = (IntegrityError, DataError)  # the row is bad, not the database
_COLUMNS = {f.name for f in fields(UsageEvent)}


def _row_from_json(line: str) -> dict:
    d = json.loads(line)
    row = {k: v for k, v in d.items() if k in _COLUMNS}
    row["created_at"] = datetime.fromisoformat(row["created_at"]).astimezone(UTC)
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


class UsageWriter:
    """``record(event)`` (sync, never blocks on the database, never raises); ``await flush()``;
    ``await close()`` drains. ``start()`` launches the writer thread; its first flush replays
    what earlier runs left in the spool."""

    def __init__(self, database_url: str, spool_dir: str | Path, *, flush_interval_s: float = 0.5,
                 batch_size: int = 500, max_backoff_s: float = 10.0) -> None:
        self._url = database_url
        self._spool = Path(spool_dir)
        self._rejected = self._spool / "rejected"
        self._interval = flush_interval_s
        self._batch_size = batch_size
        self._max_backoff = max_backoff_s
        self._journal: _Journal | None = None  # where record() appends now
        self._unjournaled: list[str] = []  # lines record() could not write (disk trouble)
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
        self._backoff = flush_interval_s
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
        if event.created_at is None:
            event.created_at = datetime.now(UTC)
        line = event.to_json() + "\n"
        with self._jlock:
            try:
                journal = self._journal or self._open_journal()
                journal.append(line.encode())
                waiting = journal.count
            except OSError:
                log.exception("usage: cannot append to the journal; row kept in memory")
                self._unjournaled.append(line)
                waiting = len(self._unjournaled)
        if waiting >= self._batch_size and self._wake is not None:
            self._wake.set()

    async def flush(self) -> bool:
        """Seal the journal and try to write the whole spool to the database now.
        Returns True when the spool is empty afterwards (everything is in the database)."""
        if self._worker is None:
            raise RuntimeError("UsageWriter.start() first")
        async with self._lock:
            return await self._flush_locked(force=True)

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
            except Exception:
                log.warning("usage: final flush failed; rows stay spooled in %s", self._spool, exc_info=True)
            with contextlib.suppress(Exception):
                await self._worker.run(self._w_close())
            await asyncio.to_thread(self._worker.stop)
            self._worker = None
        with self._jlock:  # never started, or the worker is gone: the journal stays for adoption
            if self._journal is not None:
                self._journal.close()
                self._journal = None

    @property
    def pending(self) -> int:
        """Rows recorded but not yet handed to the writer thread."""
        return (self._journal.count if self._journal else 0) + len(self._unjournaled)

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
            except Exception:  # never let the writer die; rows are on disk or back in memory
                log.exception("usage writer: unexpected error")

    def _open_journal(self) -> _Journal:
        if not self._spool_ready:
            self._spool.mkdir(parents=True, exist_ok=True)
            self._spool_ready = True
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}{_JOURNAL}"
        self._journal = _Journal.create(self._spool / name)
        return self._journal

    def _rotate(self) -> tuple[_Journal | None, list[str]]:
        with self._jlock:
            journal, self._journal = self._journal, None
            lines, self._unjournaled = self._unjournaled, []
        return journal, lines

    async def _flush_locked(self, *, force: bool) -> bool:
        journal, lines = self._rotate()
        on_disk: list[bool] = []  # the worker appends True once the in-memory lines are in a file
        try:
            return await self._worker.run(self._w_flush(journal, lines, force, on_disk))
        except BaseException:
            if lines and not on_disk:
                with self._jlock:
                    self._unjournaled[:0] = lines  # not on disk: keep them for the next try
            raise

    # -- worker thread (its own event loop and engine) ---------------------------------------------

    async def _w_open(self) -> None:
        from gateway.db.session import Database

        self._spool.mkdir(parents=True, exist_ok=True)
        self._engine = Database(self._url).engine

    async def _w_close(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()

    async def _w_flush(self, journal: _Journal | None, lines: list[str], force: bool,
                       on_disk: list[bool]) -> bool:
        if journal is not None:
            if journal.count:
                journal.seal()
                self.files_spooled += 1
            else:
                journal.discard()
        if lines:
            name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}.jsonl"
            _write_durably(self._spool / name, "".join(lines))
            on_disk.append(True)
            self.files_spooled += 1
        _adopt_orphans(self._spool)
        if not force and time.monotonic() < self._db_ok_after:
            return False
        for path in self.spooled_files():
            try:
                rows = _read_rows(path)
            except FileNotFoundError:
                continue  # another process replayed it
            except (ValueError, KeyError, TypeError):  # not ours / damaged: set aside, keep going
                log.error("usage: unreadable spool file %s moved to %s", path.name, self._rejected)
                _set_aside(path, self._rejected)
                continue
            try:
                await self._insert(rows, path)
            except Exception as exc:  # database unreachable / down / timing out: keep the file
                self._db_ok_after = time.monotonic() + self._backoff
                log.warning("usage: database unavailable (%s); %d rows stay spooled, retry in %.1fs",
                            type(exc).__name__, len(rows), self._backoff)
                self._backoff = min(self._max_backoff, self._backoff * 2)
                return False
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self._backoff = self._interval
        self._db_ok_after = 0.0
        return True

    async def _insert(self, rows: list[dict], path: Path) -> None:
        if not rows:
            return
        stmt = _insert_ignore(self._engine.dialect.name)
        try:
            async with self._engine.begin() as conn:
                result = await conn.execute(stmt, rows)
                await _touch_keys(conn, rows)
            self.rows_written += max(0, result.rowcount or 0)
        except _REJECTED:  # a row the database will never take: isolate it
            await self._insert_one_by_one(rows, path)

    async def _insert_one_by_one(self, rows: list[dict], path: Path) -> None:
        stmt = _insert_ignore(self._engine.dialect.name)
        bad: list[dict] = []
        for row in rows:
            try:
                async with self._engine.begin() as conn:
                    result = await conn.execute(stmt, [row])
                self.rows_written += max(0, result.rowcount or 0)
            except _REJECTED as exc:
                log.error("usage: row %s rejected by the database: %s", row.get("request_id"), exc.orig)
                bad.append(row)
        if bad:
            _write_durably(self._rejected / path.name, "".join(json.dumps(r, default=str) + "\n" for r in bad))


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


_JOURNAL = ".journal"


class _Journal:
    """An open journal file: ``O_APPEND`` descriptor, ``flock``-ed while this process owns it."""

    __slots__ = ("count", "fd", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd, self.count = path, fd, 0

    @classmethod
    def create(cls, path: Path) -> _Journal:
        """Created under a name adopters ignore, locked, then renamed into view: a visible
        ``.journal`` is always locked while its owner lives."""
        hidden = path.with_suffix(".new")
        fd = os.open(hidden, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(hidden, path)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                hidden.unlink()
            raise
        return cls(path, fd)

    def append(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a regular file takes it in one write; loop in case it does not
            view = view[os.write(self.fd, view):]
        self.count += 1

    def seal(self) -> None:
        """Rename to ``.jsonl`` (still locked, so no adopter races us), fsync, unlock."""
        try:
            _seal(self.path, self.fd)
        finally:
            self.close()

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # releases the flock
            self.fd = -1


def _seal(path: Path, fd: int) -> None:
    os.replace(path, path.with_suffix(".jsonl"))
    os.fsync(fd)
    _fsync_dir(path.parent)


def _adopt_orphans(spool: Path) -> None:
    """Seal the journals whose owner died (their lock can be taken)."""
    if not spool.is_dir():
        return
    for path in spool.iterdir():
        if path.suffix != _JOURNAL:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                continue  # sealed and replaced meanwhile
            if os.fstat(fd).st_size == 0:
                path.unlink()
                continue
            log.warning("usage: adopting %s left by a process that stopped without closing it", path.name)
            _seal(path, fd)
        except OSError:  # locked (owner alive) or gone meanwhile
            continue
        finally:
            os.close(fd)


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


def _write_durably(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _set_aside(path: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, folder / path.name)


def _read_rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.split("\n")
    if lines[-1].strip():  # no newline at the end: a write torn by a power loss
        log.warning("usage: %s ends with a torn line; skipped: %.80s", path.name, lines[-1])
    return [_row_from_json(line) for line in lines[:-1] if line.strip()]
