"""``cache.fair_worker.FairWorker``: one thread, turns round the shares with work waiting, urgent
jobs first but never twice in a row while a share waits, a job whose caller left skipped."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cache.fair_worker import FairWorker


async def _held(worker: FairWorker) -> tuple[threading.Event, asyncio.Task]:
    """A job that holds the worker's thread until the event is set, and its task."""
    gate, started = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return gate.wait(5)

    task = asyncio.ensure_future(worker.run("holder", hold))
    while not started.is_set():  # running on the thread now
        await asyncio.sleep(0.001)
    return gate, task


def _sleeper(ran: list[str], name: str, seconds: float):  # noqa: ANN202
    def job() -> None:
        time.sleep(seconds)
        ran.append(name)
    return job


async def test_shares_get_even_time_and_urgent_jobs_alternate_with_them() -> None:
    worker = FairWorker("test-fair")
    ran: list[str] = []
    gate, holder = await _held(worker)
    jobs = [worker.run(share, _sleeper(ran, name, cost)) for share, name, cost in
            (("a", "a1", 0.01), ("a", "a2", 0.01), ("a", "a3", 0.01), ("b", "b1", 0.06), ("b", "b2", 0.06),
             (None, "u1", 0), (None, "u2", 0))]
    tasks = [asyncio.ensure_future(j) for j in jobs]
    await asyncio.sleep(0)  # all queued behind the holder
    assert worker.waiting() == 7
    gate.set()
    await asyncio.gather(holder, *tasks)
    # urgent first, a share's job between two urgent ones; a and b start even, then b's 60 ms job
    # is worth a's next two (and more)
    assert ran == ["u1", "a1", "u2", "b1", "a2", "a3", "b2"]
    assert worker.turns == {"holder": 1, "a": 3, "b": 2, None: 2}
    assert worker.busy["b"] >= 0.12 and worker.busy["a"] >= 0.03
    worker.close()


async def test_a_share_of_short_jobs_is_not_held_behind_another_share_of_long_ones() -> None:
    """What the worker is for: a tenant with 20 long parts queued first; another's four short jobs,
    queued after them, all run before the first tenant's second part (taking turns job by job, they
    would wait for three of its parts)."""
    worker = FairWorker("test-fair")
    ran: list[str] = []
    gate, holder = await _held(worker)
    heavy = [asyncio.ensure_future(worker.run("heavy", _sleeper(ran, f"h{i}", 0.02))) for i in range(20)]
    await asyncio.sleep(0)
    light = [asyncio.ensure_future(worker.run("light", _sleeper(ran, f"l{i}", 0.001))) for i in range(4)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(holder, *light, *heavy)
    assert ran[:5] == ["h0", "l0", "l1", "l2", "l3"]
    assert ran[5:] == [f"h{i}" for i in range(1, 20)]
    worker.close()


async def test_a_share_that_went_idle_keeps_no_credit() -> None:
    """A tenant that was away does not get the thread to itself on its return for the time it was
    away: it starts level with the share working, and they alternate (with its 100 ms of credit it
    would run five jobs in a row)."""
    worker = FairWorker("test-fair")
    ran: list[str] = []
    await worker.run("a", _sleeper(ran, "a0", 0.001))
    for i in range(5):  # b alone for a while: 100 ms on the thread
        await worker.run("b", _sleeper(ran, f"b{i}", 0.02))
    gate, holder = await _held(worker)
    tasks = [asyncio.ensure_future(worker.run(s, _sleeper(ran, f"{s}{i + 1}", 0.02)))
             for i in range(6) for s in ("a", "b")]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(holder, *tasks)
    shares = "".join(name[0] for name in ran[6:])
    assert sorted(shares) == ["a"] * 6 + ["b"] * 6
    assert "aaa" not in shares and "bbb" not in shares, shares
    worker.close()


async def test_a_job_whose_caller_left_is_skipped_and_errors_reach_their_caller() -> None:
    worker = FairWorker("test-fair")
    ran: list[str] = []
    gate, holder = await _held(worker)
    gone = asyncio.ensure_future(worker.run("a", ran.append, "gone"))

    def boom() -> None:
        raise ValueError("boom")

    failing = asyncio.ensure_future(worker.run("b", boom))
    kept = asyncio.ensure_future(worker.run("a", ran.append, "kept"))
    await asyncio.sleep(0)
    gone.cancel()
    gate.set()
    with pytest.raises(ValueError, match="boom"):
        await failing
    await asyncio.gather(holder, kept)
    assert ran == ["kept"]  # the cancelled one never ran
    assert worker.waiting() == 0
    worker.close()


async def test_every_job_runs_on_the_one_thread_and_none_at_once() -> None:
    worker = FairWorker("test-fair")
    threads: set[int] = set()
    running = [0]
    most = [0]
    lock = threading.Lock()

    def job() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threads.add(threading.get_ident())
        threading.Event().wait(0.001)
        with lock:
            running[0] -= 1

    await asyncio.gather(*(worker.run(share, job) for share in ["a", "b", None, "c"] * 5))
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert most[0] == 1
    worker.close()


async def test_closing_fails_the_waiting_jobs_and_refuses_new_ones() -> None:
    worker = FairWorker("test-fair")
    gate, holder = await _held(worker)
    waiting = asyncio.ensure_future(worker.run("a", lambda: "never"))
    await asyncio.sleep(0)
    worker.close()
    with pytest.raises(RuntimeError, match="closed"):
        await waiting
    with pytest.raises(RuntimeError, match="closed"):
        await worker.run("a", lambda: None)
    gate.set()
    assert await holder is True  # the job on the thread finishes


def test_a_loop_that_ended_with_work_queued_leaves_the_worker_usable() -> None:
    """A test's event loop, or a stopped server's, may close with jobs queued and its dispatcher
    never finished; the next loop's callers are served and the old jobs are dropped."""
    worker = FairWorker("test-fair")
    ran: list[str] = []
    gate = threading.Event()
    old = asyncio.new_event_loop()

    async def leave_work() -> None:
        asyncio.ensure_future(worker.run("a", gate.wait, 5))
        asyncio.ensure_future(worker.run("a", ran.append, "old"))
        await asyncio.sleep(0.05)  # the first job is on the thread, the second waits

    old.run_until_complete(leave_work())
    old.close()  # (no cancelling: its tasks stay pending, as when a loop is dropped)
    gate.set()

    async def later() -> str:
        await worker.run("b", ran.append, "new")
        return await worker.run("a", lambda: "served")

    assert asyncio.run(later()) == "served"
    assert ran == ["new"]
    worker.close()


async def test_a_job_raising_stop_iteration_fails_its_caller_only() -> None:
    """Found by review: asyncio refuses StopIteration on a future, which ended the dispatcher and
    left every queued job of every tenant waiting."""
    worker = FairWorker("test-fair")
    gate, holder = await _held(worker)
    bad = asyncio.ensure_future(worker.run("a", next, iter(())))
    good = asyncio.ensure_future(worker.run("b", lambda: "served"))
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(RuntimeError, match="StopIteration"):
        await bad
    assert await asyncio.wait_for(good, 5) == "served"
    await holder
    worker.close()


async def test_shares_that_come_one_after_another_leave_nothing_behind() -> None:
    """Found by review: each new share's job started on the clock, which stood still, so no entry
    was ever old enough to drop (20,000 tenants in a row left 20,000)."""
    worker = FairWorker("test-fair")
    for i in range(500):
        await worker.run(f"tenant-{i}", lambda: None)
    assert len(worker._finish) == 0
    worker.close()


async def test_a_failure_of_the_workers_own_bookkeeping_fails_its_callers_instead_of_stranding_them(
        monkeypatch) -> None:
    """Found by review: an exception in the worker's step between two jobs lost the caller's answer
    and left every later caller waiting forever."""
    worker = FairWorker("test-fair")
    gate, holder = await _held(worker)
    waiting = asyncio.ensure_future(worker.run("a", lambda: "never"))
    await asyncio.sleep(0)

    def broken(share, seconds):  # noqa: ANN001, ANN202
        raise KeyError("bookkeeping")

    monkeypatch.setattr(worker, "_charge", broken)
    gate.set()
    assert await asyncio.wait_for(holder, 5) is True  # the job that ran still gets its answer
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(RuntimeError, match="closed"):
        await worker.run("a", lambda: None)


async def test_an_executor_shut_down_under_the_worker_fails_every_waiting_caller() -> None:
    """Found by review: the job picked failed and the others waited forever."""
    worker = FairWorker("test-fair")
    gate, holder = await _held(worker)
    waiting = [asyncio.ensure_future(worker.run("a", lambda: None)) for _ in range(3)]
    await asyncio.sleep(0)
    worker.executor.shutdown(wait=False)
    gate.set()
    await holder
    for task in waiting:
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(task, 5)


async def test_a_cancelled_urgent_job_takes_no_turn() -> None:
    worker = FairWorker("test-fair")
    ran: list[str] = []
    gate, holder = await _held(worker)
    urgent = [asyncio.ensure_future(worker.run(None, ran.append, f"u{i}")) for i in range(4)]
    shares = [asyncio.ensure_future(worker.run("a", ran.append, f"a{i}")) for i in range(2)]
    await asyncio.sleep(0)
    for task in urgent[:2]:
        task.cancel()
    gate.set()
    await asyncio.gather(holder, *urgent[2:], *shares)
    assert ran == ["u2", "a0", "u3", "a1"]
    worker.close()


def test_a_worker_per_loop_does_not_keep_its_loop_nor_its_thread() -> None:
    """Found by review: the schema workers, one per event loop, held their loop and so their
    entry and thread for good (30 ``asyncio.run`` calls, 30 threads)."""
    import gc

    from gateway import schema_thread

    async def compile_one() -> None:
        await schema_thread.compile_in_turn("t", '{"type": "object"}')

    for _ in range(5):
        asyncio.run(compile_one())
    gc.collect()
    assert len(schema_thread._workers) <= 1
