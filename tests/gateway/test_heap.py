"""``gateway.heap``: what survives a slow full collection is frozen, on the loop, rate-limited."""

from __future__ import annotations

import asyncio
import gc

from gateway.heap import Refreezer


async def _collect_with(refreezer: Refreezer, generation: int = 2) -> int:
    """One collection with ``refreezer`` installed; the freeze count after the loop ran once."""
    gc.callbacks.append(refreezer)
    try:
        gc.collect(generation)
    finally:
        gc.callbacks.remove(refreezer)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return gc.get_freeze_count()


async def test_slow_full_collection_freezes_what_survived(unfrozen) -> None:  # noqa: ANN001
    kept = [[i] for i in range(50_000)]  # what a lazily loaded model leaves behind (lists stay tracked)
    refreezer = Refreezer(asyncio.get_running_loop(), slow_ms=0.0, every_s=60.0)
    assert gc.get_freeze_count() == 0
    frozen = await _collect_with(refreezer)
    assert frozen >= len(kept) and refreezer.refreezes == 1
    assert not any(o is kept[0] for o in gc.get_objects())  # never walked again
    # at most once per `every_s`
    gc.unfreeze()
    assert await _collect_with(refreezer) == 0 and refreezer.refreezes == 1


async def test_fast_or_young_collections_freeze_nothing(unfrozen) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    assert await _collect_with(Refreezer(loop, slow_ms=60_000.0, every_s=0.0)) == 0  # fast enough
    assert await _collect_with(Refreezer(loop, slow_ms=0.0, every_s=0.0), generation=0) == 0  # not a full one


async def test_a_collection_on_another_thread_freezes_on_the_loop(unfrozen) -> None:  # noqa: ANN001
    """The engine's thread can trigger the slow collection; the freeze is still done by the loop."""
    import threading

    refreezer = Refreezer(asyncio.get_running_loop(), slow_ms=0.0, every_s=0.0)
    freeze, on = refreezer._freeze, []

    def spy(took_ms: float) -> None:
        on.append(threading.get_ident())
        freeze(took_ms)

    refreezer._freeze = spy  # type: ignore[method-assign]
    collector = []
    gc.callbacks.append(refreezer)
    try:
        await asyncio.to_thread(lambda: (collector.append(threading.get_ident()), gc.collect()))
    finally:
        gc.callbacks.remove(refreezer)
    await asyncio.sleep(0)
    assert collector[0] != threading.get_ident()
    assert on == [threading.get_ident()] and refreezer.refreezes == 1 and gc.get_freeze_count() > 0


async def test_a_refreeze_does_not_walk_the_frozen_objects(unfrozen, monkeypatch) -> None:  # noqa: ANN001
    """``gc.get_freeze_count()`` walks every frozen object (~35 ms for the ~420k a started gateway
    freezes): the refreeze on the event loop must not call it."""
    import gateway.heap as heap

    class NoCount:
        freeze = staticmethod(gc.freeze)

        @staticmethod
        def get_freeze_count() -> int:
            raise AssertionError("walked the frozen list on the event loop")

    monkeypatch.setattr(heap, "gc", NoCount)
    refreezer = Refreezer(asyncio.get_running_loop(), slow_ms=0.0, every_s=0.0)
    refreezer._freeze(25.0)
    assert refreezer.refreezes == 1 and gc.get_freeze_count() > 0
