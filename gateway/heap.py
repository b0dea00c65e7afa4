"""The garbage collector while the gateway serves (``settings.gc_freeze``).

A full collection walks every tracked object. At start-up those are torch, transformers, the
model and the app: ~425k objects, ~240 ms per full collection on this machine, a few times a
minute under load, on whichever thread allocates (the event loop or the engine's). That was
~0.4 ms of event-loop CPU per HTTP request and the HTTP path's p99 (README, Overhead).

    undo = tune_gc(settings)   # in the lifespan, once everything is built
    ...                        # serving
    undo()                     # at shutdown: unfreeze

- ``gc.freeze()`` once started: what is alive then is never walked again (it is still freed by
  reference counting; only cycles among those objects would outlive the process's start-up);
- what loads later (the semantic cache's embedding model on its first lookup: ~160k objects,
  ~90 ms per full collection) is frozen the same way: a full collection slower than
  ``SLOW_FULL_MS`` asks the loop to freeze again, at most once per ``REFREEZE_EVERY_S``.

Python's thresholds stay: a young threshold of 10,000 instead of 700 saved ~10% of the
loop's CPU per request, but its middle-generation collections then took up to 27 ms (2 ms
with 700), a loop stall.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

from gateway.settings import Settings

log = logging.getLogger("pagegate.heap")

SLOW_FULL_MS = 20.0
REFREEZE_EVERY_S = 10.0


class Refreezer:
    """A ``gc.callbacks`` entry: after a full collection slower than ``slow_ms``, freeze what
    survived it (on the event loop; collections run on any thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, slow_ms: float = SLOW_FULL_MS,
                 every_s: float = REFREEZE_EVERY_S) -> None:
        self._loop = loop
        self._slow_s = slow_ms / 1000
        self._every_s = every_s
        self._started = 0.0
        self._last = -1e18
        self.refreezes = 0

    def __call__(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        elif now - self._started > self._slow_s and now - self._last > self._every_s:
            self._last = now
            try:
                self._loop.call_soon_threadsafe(self._freeze, (now - self._started) * 1000)
            except RuntimeError:  # the loop is closed: nothing serves any more
                pass

    def _freeze(self, took_ms: float) -> None:
        # (no gc.get_freeze_count() here: it walks the whole frozen list, ~35 ms for the ~420k
        # objects frozen at start, more when the engine has the caches: a loop stall of its own)
        gc.freeze()
        self.refreezes += 1
        log.info("a full garbage collection took %.0f ms: froze what survived it", took_ms)


def tune_gc(settings: Settings, loop: asyncio.AbstractEventLoop | None = None) -> Callable[[], None]:
    """Freeze (``settings.gc_freeze``) and watch for what loads later; returns what undoes it."""
    if not settings.gc_freeze:
        return lambda: None
    gc.collect()
    gc.freeze()
    refreezer = Refreezer(loop or asyncio.get_running_loop())
    gc.callbacks.append(refreezer)

    def undo() -> None:
        gc.callbacks.remove(refreezer)
        gc.unfreeze()

    return undo
