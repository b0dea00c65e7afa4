"""A request's quota settlement after its response: a few milliseconds later, in batches, instead
of before the response. (Its usage row is journaled at once, before the response: durable.)

Why: 50 requests that arrive together are served one after the other on the event loop. When each
one's settlement runs before its response, the wave's last response waits for all 50 rounds of
it, and so does the next wave's admission (the event loop is busy with them). Deferred by
``settle_delay_ms`` (20 ms), the settlements of a whole wave run as one batch while the engine
steps: their Redis scripts leave in one write, and no response or admission waits for them.

What it costs, and what it does not:
- a reservation stays charged at its worst case (prompt + max_tokens) ``settle_delay_ms`` longer:
  a tenant at the very edge of its budget or TPM can see a request clamped or refused that a
  settled ledger would have let through; nobody can ever overspend (reservations only overcount);
- nothing is lost: ``drain()`` (called by ``TenancyServices.close``, before a quota rebuild and by
  the tests) runs what is pending now, and a reservation whose process died before settling it is
  refunded by the ledger after its TTL, as always; the usage rows are already journaled;
- a job that fails because Redis cannot be reached (a dropped connection, a timeout) is tried
  again, 0.5 s later and then twice as long each time up to 30 s, for up to 50 minutes: the
  settlement script is idempotent (a reservation settled already is left alone), and the ledger
  refunds an unsettled reservation whole after its one-hour TTL, so a charge dropped on a Redis
  blip used to let the tenant spend its tokens again (found by QA: 17% over a daily budget).

``settle_delay_ms = 0`` settles inline, before the response, as before."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ClusterDownError, ReadOnlyError, RedisError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.log_throttle import LogThrottle

T = TypeVar("T")

log = logging.getLogger("pagegate.aftercare")
_REDIS_DOWN = LogThrottle()  # jobs dropped (an error)
_REDIS_RETRIED = LogThrottle()  # jobs retried later (a warning: its own throttle, so it holds back no error)
_GIVEN_UP = LogThrottle()
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
# a reservation whose lease lapsed stays as a marker for two hours (``lua/quota_reserve.lua``): a
# settlement retried within that time still adds the request's real amounts
RETRY_FOR_S = 50 * 60.0
MAX_RETRYING = 20_000  # jobs waiting for a retry at most (a long outage under load): past it, given up
# Redis cannot do it now but will: unreachable, timing out, loading its data after a restart
# (BusyLoadingError is a ConnectionError), a replica after a failover, a cluster re-sharding
TRANSIENT_REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, TryAgainError, ClusterDownError)


async def to_the_end(work: Awaitable[T]) -> T:
    """Await ``work`` (a request's settlement: its usage row, its reservation) to its end even when
    this task is cancelled meanwhile, then re-raise the cancellation. (``anyio.CancelScope(shield=
    True)`` does not hold against a second ``task.cancel()``, as a server shutting down sends one:
    the settlement stopped half-way, and the row and the reservation's refund were lost.) It runs
    as a task of its own: for the paths that wait (an abort, a refusal), not the common one."""
    task = asyncio.ensure_future(work)
    interrupted = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            interrupted = interrupted or not task.done()
    if interrupted:
        task.result()  # its own error, if it failed
        raise asyncio.CancelledError
    return task.result()

Job = Callable[[], Awaitable[object] | None]  # a coroutine, or a future (no task for it), or None


class Aftercare:
    """``submit(job, label)``: call ``job()`` about ``delay_s`` from now, with the other jobs due
    then, and wait for what it returns: a coroutine, or a future (a call it submitted,
    ``QuotaLedger.settle_soon``: no task per job, where coroutines cost one each), or None;
    ``await drain()``: run everything pending now. A job that fails is logged with its ``label``
    (a request id), never propagated; one that fails because Redis cannot be reached is tried again
    later (``retry_later``, see the module's docstring)."""

    def __init__(self, delay_s: float, *, retry_first_s: float = RETRY_FIRST_S) -> None:
        self.delay_s = max(0.0, float(delay_s))
        self.retry_first_s = retry_first_s
        self._pending: list[tuple[Job, str, float]] = []  # (job, label, seconds waited so far for retries)
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task] = set()
        self._retries: dict[asyncio.TimerHandle, tuple[Job, str, float]] = {}
        self.abandoned = 0  # jobs given up: retried for RETRY_FOR_S, or past MAX_RETRYING waiting

    @property
    def inline(self) -> bool:
        """True when there is no delay: callers run their bookkeeping themselves, now."""
        return self.delay_s == 0

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._running)

    @property
    def retrying(self) -> int:
        """Jobs waiting to be tried again (Redis could not be reached)."""
        return len(self._retries)

    def submit(self, job: Job, label: str = "", waited_s: float = 0.0) -> None:
        self._pending.append((job, label, waited_s))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._start_batch)

    def retry_later(self, job: Job, label: str = "", waited_s: float = 0.0) -> None:
        """Try ``job`` again after a back-off (it failed because Redis could not be reached), or give
        it up, logged, once it has been retried for ``RETRY_FOR_S``."""
        if waited_s >= RETRY_FOR_S or len(self._retries) >= MAX_RETRYING:
            self.abandoned += 1
            _GIVEN_UP.log(log, logging.ERROR, "request bookkeeping given up after %.0f s of retries %s (%d "
                          "waiting): Redis could not be reached", waited_s, label, len(self._retries))
            return
        delay = min(RETRY_MAX_S, max(self.retry_first_s, waited_s))  # 0.5, 0.5, 1, 2, 4, ... 30 s
        handle: asyncio.TimerHandle | None = None

        def due() -> None:
            self._retries.pop(handle, None)
            self.submit(job, label, waited_s + delay)

        handle = asyncio.get_running_loop().call_later(delay, due)
        self._retries[handle] = (job, label, waited_s + delay)

    def _start_batch(self) -> None:
        self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.ensure_future(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[tuple[Job, str, float]]) -> None:
        waits, started_jobs = [], []
        for entry in batch:
            job, label, _waited = entry
            try:
                started = job()
            except Exception:
                log.exception("request bookkeeping failed %s", label)
                continue
            if started is not None:
                waits.append(started)
                started_jobs.append(entry)
        results = await asyncio.gather(*waits, return_exceptions=True)
        for result, (job, label, waited_s) in zip(results, started_jobs, strict=True):
            if isinstance(result, RedisError):  # Redis down: one line per 10 s, not a traceback a request
                retried = isinstance(result, TRANSIENT_REDIS_ERRORS)
                # (retried: a warning, handled without anyone; dropped: an error, found by a re-check QA
                # whose restarts of Redis logged every retried settlement at ERROR)
                if retried:
                    _REDIS_RETRIED.log(log, logging.WARNING, "request bookkeeping failed %s: %s: %s (retried later)",
                                       label, type(result).__name__, result)
                    self.retry_later(job, label, waited_s)
                else:
                    _REDIS_DOWN.log(log, logging.ERROR, "request bookkeeping failed %s: %s: %s", label,
                                    type(result).__name__, result)
            elif isinstance(result, BaseException):
                log.error("request bookkeeping failed %s", label, exc_info=result)

    async def drain(self) -> None:
        """Run every pending job now, and those waiting to be retried, and wait for the batches
        already running. (A job that fails again is scheduled again: drain does not wait for it.)"""
        for handle, (job, label, waited_s) in list(self._retries.items()):
            handle.cancel()
            del self._retries[handle]
            self._pending.append((job, label, waited_s))
        while self._pending or self._running:
            if self._timer is not None:
                self._timer.cancel()
            self._start_batch()
            await asyncio.gather(*list(self._running), return_exceptions=True)
