"""Admission in batches (``gateway.coalesce``): the calls of one event-loop iteration, grouped."""

from __future__ import annotations

import asyncio

import pytest

from gateway.coalesce import Coalescer


async def test_calls_of_one_iteration_go_in_one_batch_per_key():
    batches: list[tuple[str, list[int]]] = []

    async def run(key: str, items: list[int]) -> list[int]:
        batches.append((key, list(items)))
        await asyncio.sleep(0)
        return [i * 10 for i in items]

    c: Coalescer = Coalescer(run)
    results = await asyncio.gather(*(c.submit("a" if i % 2 else "b", i) for i in range(6)))
    assert results == [0, 10, 20, 30, 40, 50]  # each caller gets its own item's result
    assert sorted(batches) == [("a", [1, 3, 5]), ("b", [0, 2, 4])]
    # a later iteration is a new batch
    assert await c.submit("a", 7) == 70
    assert batches[-1] == ("a", [7])


async def test_batches_are_capped_and_keep_order():
    sizes: list[list[int]] = []

    async def run(_key: str, items: list[int]) -> list[int]:
        sizes.append(items)
        return items

    c: Coalescer = Coalescer(run, max_batch=4)
    assert await asyncio.gather(*(c.submit("k", i) for i in range(10))) == list(range(10))
    assert sizes == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(ValueError):
        Coalescer(run, max_batch=0)


async def test_an_exception_result_reaches_its_caller_alone_and_a_failed_batch_reaches_all():
    async def run(key: str, items: list[int]) -> list:
        if key == "down":
            raise ConnectionError("store down")
        return [ValueError(f"bad {i}") if i < 0 else i for i in items]

    c: Coalescer = Coalescer(run)
    got = await asyncio.gather(c.submit("k", 1), c.submit("k", -2), c.submit("k", 3), return_exceptions=True)
    assert got[0] == 1 and got[2] == 3 and isinstance(got[1], ValueError) and "bad -2" in str(got[1])
    got = await asyncio.gather(c.submit("down", 1), c.submit("down", 2), return_exceptions=True)
    assert all(isinstance(g, ConnectionError) for g in got)


async def test_a_wrong_number_of_results_is_an_error_not_a_silent_mismatch():
    async def run(_key: str, items: list[int]) -> list[int]:
        return items[:-1]

    c: Coalescer = Coalescer(run)
    got = await asyncio.gather(c.submit("k", 1), c.submit("k", 2), return_exceptions=True)
    assert all(isinstance(g, RuntimeError) for g in got)


async def test_a_cancelled_caller_s_share_goes_to_orphan():
    release = asyncio.Event()
    orphaned: list[tuple[str, int, int]] = []

    async def run(_key: str, items: list[int]) -> list[int]:
        await release.wait()
        return [i + 100 for i in items]

    c: Coalescer = Coalescer(run, orphan=lambda key, item, result: orphaned.append((key, item, result)))
    keep = asyncio.ensure_future(c.submit("k", 1))
    leave = asyncio.ensure_future(c.submit("k", 2))
    await asyncio.sleep(0.01)  # the batch is in flight
    leave.cancel()
    release.set()
    assert await keep == 101
    await c.drain()
    assert orphaned == [("k", 2, 102)]


def test_a_new_event_loop_starts_afresh():
    async def run(_key: str, items: list[int]) -> list[int]:
        return items

    c: Coalescer = Coalescer(run)

    async def call() -> int:
        return await c.submit("k", 5)

    for _ in range(2):  # e.g. one test's loop, then the next one's
        assert asyncio.run(call()) == 5
