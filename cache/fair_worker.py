"""One worker thread shared by tenants in turns (``FairWorker``).

A model such as the cache's MiniLM runs on one thread of its own (its tokenizer must not be used
by two threads at once, and two forwards at once would only fight over the cores). Every tenant's
semantic-cache lookups and ``/v1/embeddings`` batches go to that thread. Run first come, first
served, one tenant's 2,048-text batch (tens of seconds of parts) made every other tenant's
lookups and embeddings wait behind all of its parts that were queued first.

Here each job names its *share* (an opaque value: the gateway hands in the tenant), and the
thread's time is shared evenly between the shares that have work waiting (start-time fair
queueing, with each job's cost its time on the thread, measured there):

- a share's next job is tagged with the time its share has had on the thread, counted from the
  moment it last had work waiting (``max(now, its last job's finish)`` on the worker's virtual clock,
  which is the tag of the job last started); the job with the smallest tag goes next, the share
  that waited longest on a tie. So a tenant sending one short text at a time is not held behind
  another's queue of long parts: its texts go first until it has had as much of the thread, and
  the wait is at most the part running. A share that goes idle keeps no credit;
- a job of share ``None`` is *urgent* (a lookup batch on a chat's path, a few short texts): it goes
  before the shares' jobs, but never twice in a row while a share's job waits, so a flood of
  lookups cannot hold back the embeddings; its time is charged to no share;
- a job whose caller has gone (its awaiting task cancelled: the client left) is skipped, not run.

Callers keep their jobs short (``cache.embedder`` cuts batches into parts of ~0.1 s): a job is
never interrupted. One job is on the thread at a time; when it ends, the next is picked on the event
loop (no task between them).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


class _Job:
    __slots__ = ("args", "fn", "future")

    def __init__(self, fn: Callable[..., Any], args: tuple, future: asyncio.Future) -> None:
        self.fn, self.args, self.future = fn, args, future


class FairWorker:
    """``await worker.run(share, fn, *args)`` runs ``fn(*args)`` on the worker's one thread, in the
    share's turn; returns its result or raises its exception. Called from one event loop at a time
    (its queues are the loop's: not for two threads' loops at once)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._urgent: collections.deque[_Job] = collections.deque()
        self._shares: dict[Hashable, collections.deque[_Job]] = {}  # waiting jobs; the longest waiting first
        self._finish: dict[Hashable, float] = {}  # a share's last job's finish tag (seconds of thread time)
        self._clock = 0.0  # virtual time: the tag of the share's job last started
        self._last_urgent = False
        self._loop_ref: weakref.ref | None = None  # the event loop whose jobs these are (held weakly:
        # a worker per loop, as gateway.schema_thread keeps, must not keep its loop alive: review)
        self._running = False  # a job is on the thread
        self._closed = False
        self.turns: collections.Counter = collections.Counter()  # jobs run per share (None: urgent)
        self.busy: collections.Counter = collections.Counter()  # seconds on the thread per share

    async def run(self, share: Hashable | None, fn: Callable[..., Any], *args: Any) -> Any:
        if self._closed:
            raise RuntimeError("the worker is closed")
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, loop.create_future())
        if share is None:
            self._urgent.append(job)
        else:
            queue = self._shares.get(share)
            if queue is None:
                queue = self._shares[share] = collections.deque()
            queue.append(job)
        if self._loop is not loop:  # a first loop, or an earlier one's jobs left (a test's, a stopped
            if self._loop_ref is not None:  # server's): nobody awaits those, and a job of theirs still
                self._forget_other_loops(loop)  # on the thread reports to a loop that is gone
            self._loop_ref, self._running = weakref.ref(loop), False
        if not self._running:
            self._advance()
        return await job.future

    @property
    def _loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop_ref() if self._loop_ref is not None else None

    def _forget_other_loops(self, loop: asyncio.AbstractEventLoop) -> None:
        """Drop the jobs of an event loop that is gone (a test's, or a server's that stopped with
        work queued): their futures cannot be set from this loop; they are cancelled on their own
        loop if it still runs (review: a loop that stopped and ran again had a caller wait forever)."""
        for job in [*self._urgent, *(j for q in self._shares.values() for j in q)]:
            if job.future.get_loop() is not loop:
                with contextlib.suppress(RuntimeError):  # (that loop is closed)
                    job.future.get_loop().call_soon_threadsafe(job.future.cancel)
        self._urgent = collections.deque(j for j in self._urgent if j.future.get_loop() is loop)
        for share in list(self._shares):
            kept = collections.deque(j for j in self._shares[share] if j.future.get_loop() is loop)
            if kept:
                self._shares[share] = kept
            else:
                del self._shares[share]

    def waiting(self) -> int:
        """Jobs queued, not counting the one running."""
        return len(self._urgent) + sum(len(q) for q in self._shares.values())

    def _pick_share(self) -> Hashable:
        """The share with work waiting whose next job has the smallest start tag."""
        best, tag = None, 0.0
        for share in self._shares:
            t = max(self._clock, self._finish.get(share, 0.0))
            if best is None or t < tag:
                best, tag = share, t
        self._clock = tag
        return best

    def _next(self) -> tuple[Hashable | None, _Job] | None:
        """The next job whose caller still waits, and its share; None when there is none."""
        while self._urgent or self._shares:
            if self._urgent and not (self._last_urgent and self._shares):
                job, share = self._urgent.popleft(), None
            else:
                share = self._pick_share()
                queue = self._shares.pop(share)
                job = queue.popleft()
                if queue:
                    self._shares[share] = queue  # behind the others on a tie
            if not job.future.done():  # (cancelled: its caller left, and used no turn)
                self._last_urgent = share is None
                return share, job
        return None

    def _charge(self, share: Hashable | None, seconds: float) -> None:
        self.turns[share] += 1
        self.busy[share] += seconds
        if share is None:
            return
        self._finish[share] = max(self._clock, self._finish.get(share, 0.0)) + seconds
        if not self._shares:  # no share waits: nobody is owed anything (and shares that come one
            self._finish.clear()  # after another, each on the clock, leave no entry behind: review)
            return
        for idle in [s for s, f in self._finish.items() if f <= self._clock and s not in self._shares]:
            del self._finish[idle]  # no debt to remember: it starts from the clock when it comes back

    def _advance(self, ran: tuple[Hashable | None, float] | None = None) -> None:
        """Charge the job that ``ran`` (its share, its seconds) and ``_start_next``; should the
        worker's own bookkeeping fail, every caller waiting is failed and the worker closed rather
        than left waiting forever (found by review)."""
        try:
            if ran is not None:
                self._charge(*ran)
            self._start_next()
        except Exception:
            log.exception("%s: the worker failed; closing it", self.name)
            self._running = False
            self.close()

    def _start_next(self) -> None:
        """Put the next job on the thread; its end comes back to ``_finished`` on the loop (no task
        between: an idle worker's job costs its caller no more loop turns than ``run_in_executor``)."""
        picked = None if self._closed else self._next()
        if picked is None:
            self._running = False
            return
        share, job = picked
        loop = self._loop
        self._running = True

        def done(cf: Future) -> None:  # on the worker's thread
            try:
                loop.call_soon_threadsafe(self._finished, loop, share, job, cf)
            except RuntimeError:  # the loop is closed: its callers are gone
                pass

        try:
            self.executor.submit(_timed, job.fn, job.args).add_done_callback(done)
        except RuntimeError as err:  # the executor shut down under it (the interpreter's exit):
            self._running = False  # nothing more can run
            _settle(job.future, False, err)
            self.close()

    def _finished(self, loop: asyncio.AbstractEventLoop, share: Hashable | None, job: _Job, cf: Future) -> None:
        try:
            seconds, ok, value = cf.result()
        except BaseException as err:  # noqa: BLE001 - cancelled by close(), or a SystemExit in the job
            seconds, ok, value = 0.0, False, RuntimeError(f"the job did not finish: {type(err).__name__}")
        try:
            if loop is self._loop:  # (else an earlier loop's job, back late: not this loop's turns)
                self._advance((share, seconds))  # the thread's next job first: the caller can wait
        finally:
            _settle(job.future, ok, value)

    def _fail_waiting(self) -> None:
        jobs = list(self._urgent) + [j for q in self._shares.values() for j in q]
        self._urgent.clear()
        self._shares.clear()
        for job in jobs:
            if not job.future.done():
                with contextlib.suppress(RuntimeError):  # (its loop is closed)
                    job.future.set_exception(RuntimeError("the worker is closed"))

    def close(self) -> None:
        """Stop: the job running finishes on its thread (the process's exit waits for it); the
        waiting ones fail."""
        self._closed = True
        try:
            self._fail_waiting()
        finally:
            self.executor.shutdown(wait=False, cancel_futures=True)


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():  # (cancelled: its caller left)
        return
    try:
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
    except (TypeError, RuntimeError) as err:  # (a future refuses some exceptions: its caller gets why)
        future.set_exception(RuntimeError(f"the job failed: {type(value).__name__} ({type(err).__name__})"))


def _timed(fn: Callable[..., Any], args: tuple) -> tuple[float, bool, Any]:
    """On the worker's thread: (seconds it took, whether it returned, its result or exception)."""
    t0 = time.perf_counter()
    try:
        value, ok = fn(*args), True
    except StopIteration as err:  # a future cannot hold it (asyncio refuses it): the caller gets why
        value, ok = RuntimeError(f"the job raised {type(err).__name__}"), False
    except Exception as err:  # noqa: BLE001 - handed to its caller
        value, ok = err, False
    return time.perf_counter() - t0, ok, value
