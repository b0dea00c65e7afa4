"""The usage spool's files: the memory-mapped journal a process copies its rows into, the
adoption of journals whose owner died, and durable (fsynced) writes. ``gateway/usage.py`` says
how the spool works as a whole."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import logging
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("gateway.usage")

JOURNAL_BYTES = 1 << 20  # a journal's reserved size: ~2,300 rows (sealed every flush interval or batch)

JOURNAL_SUFFIX = ".journal"
_HIDDEN = ".new"  # a journal being made, or a spare not in use yet: never holds rows
_SPARE_GRACE_S = 60.0  # an unlocked .new file younger than this may be one being made


class Journal:
    """An open journal file, mapped into memory and ``flock``-ed while this process owns it. Its
    blocks are reserved when it is made (``posix_fallocate``: a full disk fails here, cleanly,
    never as a SIGBUS on a later copy); rows are copied in at ``pos``; what follows is zeros,
    cut off when the journal is sealed, closed, or adopted after a crash."""

    __slots__ = ("count", "fd", "map", "path", "pos")

    def __init__(self, path: Path, fd: int, mapping: mmap.mmap) -> None:
        self.path, self.fd, self.map, self.count, self.pos = path, fd, mapping, 0, 0

    @classmethod
    def create(cls, path: Path, size: int = JOURNAL_BYTES, *, reveal: bool = True) -> Journal:
        """Made under a name adopters do not read (``.new``), locked, then renamed into view
        (now, or by ``reveal()``): a visible ``.journal`` is always locked while its owner lives."""
        hidden = path.with_suffix(_HIDDEN)
        fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)  # (rows: owner only)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:  # (not Linux: sized without reserving its blocks)
                os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            journal = cls(path, fd, mapping)
            if reveal:
                journal.reveal()
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                hidden.unlink()
            raise
        return journal

    def reveal(self) -> None:
        os.replace(self.path.with_suffix(_HIDDEN), self.path)

    def prefault(self) -> None:
        """Map every page writable now (``MADV_POPULATE_WRITE``, Linux 5.14+; the data is not
        touched), from the writer thread with the GIL released, so no row's copy takes a page
        fault on the event loop. Best effort: without it the first row on each page faults."""
        madvise = _libc_madvise()
        if madvise is None:
            return
        view = ctypes.c_char.from_buffer(self.map)
        try:
            madvise(ctypes.addressof(view), len(self.map), _MADV_POPULATE_WRITE)
        finally:
            del view  # release the export, or the map could not be closed

    def append(self, data: bytes) -> bool:
        """Copy one line in; False when it does not fit (the caller starts another journal)."""
        end = self.pos + len(data)
        if end > len(self.map):
            return False
        self.map[self.pos:end] = data
        self.pos = end
        self.count += 1
        return True

    def seal(self) -> None:
        """Cut the zeros off, rename to ``.jsonl`` (still locked, so no adopter races us), fsync,
        unlock."""
        try:
            self._unmap()
            _seal(self.path, self.fd)
        finally:
            self.close()

    def discard(self) -> None:
        for path in (self.path, self.path.with_suffix(_HIDDEN)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.close()

    def _unmap(self) -> None:
        if not self.map.closed:
            self.map.close()
            os.ftruncate(self.fd, self.pos)

    def close(self) -> None:
        """Stop using it (its rows stay on disk for the flush that adopts it)."""
        if self.fd >= 0:
            with contextlib.suppress(OSError, ValueError):
                self._unmap()
            with contextlib.suppress(OSError):
                os.close(self.fd)  # releases the flock
            self.fd = -1


def _seal(path: Path, fd: int) -> None:
    os.replace(path, path.with_suffix(".jsonl"))
    os.fsync(fd)
    _fsync_dir(path.parent)


_MADV_POPULATE_WRITE = 23


@functools.cache
def _libc_madvise():  # noqa: ANN202 - a ctypes function, or None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise  # ctypes releases the GIL around the call
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


@contextlib.contextmanager
def _orphaned(path: Path, flags: int) -> Iterator[int | None]:
    """A descriptor of ``path``, locked, when its owner is gone (its ``flock`` can be taken) and
    it is still the same file; None when it is locked (owner alive) or gone meanwhile."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except OSError:
            same = False
        yield fd if same else None
    finally:
        os.close(fd)


def _written_length(fd: int) -> int:
    """How much of a journal its owner wrote: up to the zeros of its reserved, unwritten end."""
    data = os.pread(fd, os.fstat(fd).st_size, 0)
    return len(data.rstrip(b"\0"))


def adopt_orphans(spool: Path) -> None:
    """Seal the journals whose owner died; remove the spare (``.new``) journals such owners left
    unused (they never hold rows)."""
    if not spool.is_dir():
        return
    for path in spool.iterdir():
        if path.suffix not in (JOURNAL_SUFFIX, _HIDDEN):
            continue
        with _orphaned(path, os.O_RDWR) as fd:
            if fd is None:
                continue
            try:
                if path.suffix == _HIDDEN:  # (an unlocked one may be a second old: being made now)
                    if time.time() - os.fstat(fd).st_mtime > _SPARE_GRACE_S:
                        path.unlink()
                    continue
                length = _written_length(fd)
                if length == 0:
                    path.unlink()
                    continue
                os.ftruncate(fd, length)  # its owner died before cutting the reserved zeros off
                log.warning("usage: adopting %s left by a process that stopped without closing it", path.name)
                _seal(path, fd)
            except OSError:  # gone meanwhile
                continue


def write_durably(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "w",
                  encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: no empty .tmp left behind for good (found by QA)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def set_aside(path: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, folder / path.name)
