"""Deferred request bookkeeping (``gateway.aftercare``): jobs run about ``delay`` later, together;
``drain`` runs what is pending now; a failing job is logged and never stops the others."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from gateway.aftercare import Aftercare


async def test_jobs_run_together_after_the_delay():
    care = Aftercare(0.05)
    ran: list[tuple[int, float]] = []
    t0 = time.perf_counter()

    def job(i: int):  # noqa: ANN202
        async def run() -> None:
            ran.append((i, time.perf_counter() - t0))
        return run

    for i in range(5):
        care.submit(job(i))
    assert care.pending == 5 and ran == []
    await asyncio.sleep(0.01)
    assert ran == []  # not before the delay
    await asyncio.sleep(0.1)
    assert [i for i, _ in ran] == [0, 1, 2, 3, 4]
    assert all(t >= 0.045 for _, t in ran)
    assert care.pending == 0


async def test_drain_runs_pending_jobs_now_and_survives_failures(caplog):
    care = Aftercare(60)  # would wait a minute
    done: list[int] = []

    async def ok() -> None:
        await asyncio.sleep(0)
        done.append(1)

    async def boom() -> None:
        raise RuntimeError("settle failed")

    care.submit(ok)
    care.submit(boom)
    care.submit(ok)
    await asyncio.wait_for(care.drain(), 5)
    assert done == [1, 1] and care.pending == 0
    assert "request bookkeeping failed" in caplog.text
    care.submit(ok)  # a new batch after a drain gets its own timer
    await asyncio.wait_for(care.drain(), 5)
    assert done == [1, 1, 1]


async def test_zero_delay_means_inline():
    assert Aftercare(0).inline and not Aftercare(0.005).inline


async def test_jobs_that_return_futures_run_in_one_task(caplog):
    """A job may submit its work and return its future (``QuotaLedger.settle_soon``), or None:
    the batch is one task however many jobs it holds, ``drain`` waits for the futures, and a
    failure is logged with the job's label."""
    loop = asyncio.get_running_loop()
    care = Aftercare(60)
    futures: list[asyncio.Future] = []

    def submitted() -> asyncio.Future:
        futures.append(loop.create_future())
        return futures[-1]

    def refused_at_once() -> None:
        raise RuntimeError("settle failed at once")

    for _ in range(50):
        care.submit(submitted)
    care.submit(lambda: None)  # nothing to wait for (settled before)
    care.submit(submitted, "req_late")
    care.submit(refused_at_once, "req_early")
    before = len(asyncio.all_tasks())
    drained = asyncio.ensure_future(care.drain())
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) == before + 2  # the drain and the batch: no task per job
    assert len(futures) == 51 and not drained.done()
    for fut in futures[:50]:
        fut.set_result(True)
    futures[50].set_exception(RuntimeError("settle failed later"))
    await asyncio.wait_for(drained, 5)
    assert care.pending == 0
    assert "settle failed later" in caplog.text and "req_late" in caplog.text
    assert "settle failed at once" in caplog.text and "req_early" in caplog.text


async def test_to_the_end_finishes_a_settlement_through_repeated_cancels():
    """A request cancelled twice (a shutdown's answer, then uvicorn's own at its timeout) while it
    settles: the settlement still ends (its row, its refund), then the cancellation goes on.
    ``anyio.CancelScope(shield=True)`` stopped it half-way."""
    from gateway.aftercare import to_the_end

    log: list[str] = []

    async def settle() -> str:
        log.append("start")
        await asyncio.sleep(0.1)
        log.append("end")
        return "settled"

    async def request() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            log.append(await to_the_end(settle()))

    task = asyncio.ensure_future(request())
    await asyncio.sleep(0.01)
    task.cancel()  # into the settlement
    await asyncio.sleep(0.03)
    task.cancel()  # during it
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["start", "end"]  # (the cancellation re-raised after it: nothing appended)
    assert await to_the_end(settle()) == "settled"

    async def failing() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError):
        await to_the_end(failing())


async def test_settlements_failing_while_redis_is_down_log_a_line_not_tracebacks(caplog):
    """Found by QA: every settlement that failed while Redis was away logged a full traceback; a
    Redis error is now one line (its repr) per 10 s, the count of the others held back; any other
    failure keeps its traceback."""
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from gateway import aftercare as module

    kept = module._REDIS_RETRIED  # a fresh throttle: an earlier test's line must not hold this one back
    module._REDIS_RETRIED = module.LogThrottle()
    try:
        care = Aftercare(delay_s=0.001)
        loop = asyncio.get_running_loop()

        def failing(exc: BaseException):  # noqa: ANN202
            def job() -> asyncio.Future:
                fut = loop.create_future()
                fut.set_exception(exc)
                return fut
            return job

        for i in range(5):
            care.submit(failing(RedisTimeoutError("Redis sent no reply for 2.0 s")), f"(quota settlement of req_{i})")
        care.submit(failing(ValueError("a bug")), "(quota settlement of req_bug)")
        with caplog.at_level(logging.WARNING, logger="pagegate.aftercare"):
            await care.drain()
    finally:
        module._REDIS_RETRIED = kept
    redis_lines = [r for r in caplog.records if "Redis sent no reply" in r.getMessage()]
    assert len(redis_lines) == 1 and not redis_lines[0].exc_info
    bug = [r for r in caplog.records if "req_bug" in r.getMessage()]
    assert len(bug) == 1 and bug[0].exc_info is not None


async def test_a_job_that_cannot_reach_redis_is_tried_again(caplog, monkeypatch):
    """Found by QA: a settlement that failed on a dropped Redis connection was logged and forgotten;
    an hour later the ledger refunded its reservation whole and the tenant spent its tokens again.
    Connection errors and timeouts are retried, with a back-off; other errors are not."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import ResponseError

    from gateway import aftercare
    from gateway.log_throttle import LogThrottle

    monkeypatch.setattr(aftercare, "_REDIS_DOWN", LogThrottle())  # not held back by an earlier test's line
    monkeypatch.setattr(aftercare, "_REDIS_RETRIED", LogThrottle())
    care = Aftercare(0.01, retry_first_s=0.02)
    calls = {"flaky": 0, "broken": 0}

    async def flaky() -> None:
        calls["flaky"] += 1
        if calls["flaky"] <= 2:
            raise RedisConnectionError("Connection reset by peer")

    async def broken() -> None:
        calls["broken"] += 1
        raise ResponseError("a script error: retrying would not help")

    care.submit(flaky, "(flaky)")
    care.submit(broken, "(broken)")
    for _ in range(100):
        await asyncio.sleep(0.02)
        if calls["flaky"] == 3 and not care.retrying and not care.pending:
            break
    assert calls == {"flaky": 3, "broken": 1}
    assert "retried later" in caplog.text
    retried = [r for r in caplog.records if "retried later" in r.getMessage()]
    assert retried and all(r.levelname == "WARNING" for r in retried)  # handled: no page for an operator
    assert any(r.levelname == "ERROR" and "(broken)" in r.getMessage() for r in caplog.records)  # dropped: an error


async def test_drain_runs_the_jobs_waiting_for_a_retry_now():
    from redis.exceptions import TimeoutError as RedisTimeoutError

    care = Aftercare(60, retry_first_s=60)  # neither the batch nor the retry would come on its own
    calls = []

    async def once_down() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RedisTimeoutError("Timeout reading from socket")

    care.submit(once_down)
    await asyncio.wait_for(care.drain(), 5)
    assert len(calls) == 1 and care.retrying == 1
    await asyncio.wait_for(care.drain(), 5)
    assert len(calls) == 2 and care.retrying == 0 and care.pending == 0


async def test_a_job_is_given_up_after_the_retry_window(caplog, monkeypatch):
    from redis.exceptions import ConnectionError as RedisConnectionError

    from gateway import aftercare
    from gateway.log_throttle import LogThrottle

    monkeypatch.setattr(aftercare, "RETRY_FOR_S", 0.05)
    monkeypatch.setattr(aftercare, "_GIVEN_UP", LogThrottle())
    care = Aftercare(0.005, retry_first_s=0.01)

    async def down() -> None:
        raise RedisConnectionError("Connection refused")

    care.submit(down, "(req_x)")
    for _ in range(100):
        await asyncio.sleep(0.01)
        if care.abandoned:
            break
    assert care.abandoned == 1 and not care.retrying
    assert "given up after" in caplog.text and "(req_x)" in caplog.text
