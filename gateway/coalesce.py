"""Admission in batches: the calls of one event-loop iteration, grouped, handed over together.

Fifty requests that arrive together each run the same three Redis scripts (per-address window,
key/tenant RPM windows, quota reservation). One script call per request costs the event loop
~20-40 µs of Python and Redis as much again, one request after the other, so the wave's last
request waits ~10 ms for the others. A ``Coalescer`` collects the calls made during one
event-loop iteration, groups them by a key (the Redis keys they touch) and hands each group to
one batch function, which runs one script for the whole group. The scripts take the group's
requests one after the other, exactly as separate calls would, atomically.

A caller cancelled while its batch is in flight gets nothing; what the batch took for it is handed
to ``orphan`` (the quota ledger releases such a reservation at once instead of leaving it open
until its TTL)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

log = logging.getLogger("pagegate.coalesce")

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")

BatchFn = Callable[[K, list[T]], Awaitable[Sequence[Any]]]  # one result (or exception) per item


class Coalescer(Generic[K, T, R]):
    """``await submit(key, item)`` → that item's result from ``run(key, items)``, which receives
    every item submitted under ``key`` during the same event-loop iteration (at most
    ``max_batch`` at a time) and returns one result per item, in order; a result that is an
    exception is raised to its caller alone. An exception from ``run`` itself reaches every
    caller of the batch."""

    def __init__(self, run: BatchFn, *, orphan: Callable[[K, T, R], None] | None = None,
                 max_batch: int = 128) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self._run = run
        self._orphan = orphan
        self.max_batch = max_batch
        self._groups: dict[K, list[tuple[T, asyncio.Future]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop a flush is scheduled on
        self._tasks: set[asyncio.Task] = set()

    def submit(self, key: K, item: T) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop (tests): an old loop's calls are gone
            self._groups = {}
            self._loop = loop
            loop.call_soon(self._flush)
        elif not self._groups:
            loop.call_soon(self._flush)
        fut = loop.create_future()
        group = self._groups.get(key)
        if group is None:
            self._groups[key] = [(item, fut)]
        else:
            group.append((item, fut))
        return fut

    def _flush(self) -> None:
        groups, self._groups = self._groups, {}
        for key, entries in groups.items():
            for i in range(0, len(entries), self.max_batch):
                task = asyncio.ensure_future(self._deliver(key, entries[i:i + self.max_batch]))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _deliver(self, key: K, entries: list[tuple[T, asyncio.Future]]) -> None:
        try:
            results = await self._run(key, [item for item, _ in entries])
            if len(results) != len(entries):
                raise RuntimeError(f"batch returned {len(results)} results for {len(entries)} items")
        except BaseException as exc:
            for _, fut in entries:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (item, fut), result in zip(entries, results, strict=True):
            if not fut.done():
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
            elif self._orphan is not None and not isinstance(result, BaseException):
                try:
                    self._orphan(key, item, result)
                except Exception:
                    log.exception("undoing a cancelled caller's share of a batch failed")

    async def drain(self) -> None:
        """Wait for the batches in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
