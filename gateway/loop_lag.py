"""How late the event loop runs, while the gateway serves (``GET /metrics``, and a warning in the log).

Everything the gateway does for its requests runs on one event loop; anything that holds it (a
long computation, a blocking call, a C function that walks a large heap) delays every request in
flight. ``LoopLagMonitor`` sleeps ``interval_s`` again and again and records how much later than
asked each sleep ends: over the last minute its maximum and the number of stalls over
``stall_ms``, since start the total count and the worst one. A stall over ``warn_ms`` is logged
(at most once per ``warn_every_s``), so an operator sees it without running a profiler.

Cost: ``1 / interval_s`` wake-ups a second (10 by default), a few microseconds each.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

log = logging.getLogger("pagegate.loop")


class LoopLagMonitor:
    def __init__(self, *, interval_s: float = 0.1, stall_ms: float = 50.0, warn_ms: float = 200.0,
                 warn_every_s: float = 60.0, window_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self.stall_ms = stall_ms
        self.warn_ms = warn_ms
        self.warn_every_s = warn_every_s
        self.window_s = window_s
        self._recent: collections.deque[tuple[float, float]] = collections.deque()  # (when, lag ms)
        self.stalls_total = 0
        self.worst_ms = 0.0
        self._last_warning = -1e18
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            now = time.perf_counter()
            self.record((now - asked - self.interval_s) * 1000, now)

    def record(self, lag_ms: float, now: float) -> None:
        lag_ms = max(0.0, lag_ms)
        recent = self._recent
        if lag_ms >= 1.0:  # only what shows: an idle loop records nothing
            recent.append((now, lag_ms))
        while recent and recent[0][0] < now - self.window_s:
            recent.popleft()
        self.worst_ms = max(self.worst_ms, lag_ms)
        if lag_ms >= self.stall_ms:
            self.stalls_total += 1
        if lag_ms >= self.warn_ms and now - self._last_warning >= self.warn_every_s:
            self._last_warning = now
            log.warning("the event loop stalled %.0f ms: every request in flight waited that long "
                        "(GET /metrics: event_loop)", lag_ms)

    def snapshot(self) -> dict:
        now = time.perf_counter()
        recent = [lag for when, lag in self._recent if when >= now - self.window_s]
        return {
            "lag_ms_max_last_minute": round(max(recent, default=0.0), 2),
            "stalls_last_minute": sum(1 for lag in recent if lag >= self.stall_ms),
            "stalls_total": self.stalls_total,
            "stall_threshold_ms": self.stall_ms,
            "lag_ms_worst": round(self.worst_ms, 2),
        }
