"""``gateway.loop_lag``: a loop held on purpose shows as a stall, counted, logged once per period."""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.loop_lag import LoopLagMonitor


async def test_a_held_loop_is_a_stall_counted_and_logged_once(caplog) -> None:  # noqa: ANN001
    monitor = LoopLagMonitor(interval_s=0.01, stall_ms=50.0, warn_ms=100.0, warn_every_s=60.0)
    monitor.start()
    try:
        await asyncio.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="pagegate.loop"):
            for _ in range(2):
                time.sleep(0.25)  # what a blocking call on the loop does to every request in flight
                await asyncio.sleep(0.05)
    finally:
        await monitor.stop()
    snap = monitor.snapshot()
    assert snap["stalls_total"] >= 2 and snap["stalls_last_minute"] >= 2  # (a busy machine may add one)
    assert snap["lag_ms_max_last_minute"] >= 200 and snap["lag_ms_worst"] >= 200
    warnings = [r for r in caplog.records if "the event loop stalled" in r.getMessage()]
    assert len(warnings) == 1  # at most once per warn_every_s


def test_the_last_minute_forgets_older_stalls_but_the_totals_keep_them() -> None:
    monitor = LoopLagMonitor(stall_ms=50.0, window_s=60.0)
    monitor.record(120.0, now=1000.0)
    monitor.record(0.2, now=1001.0)  # an idle loop: nothing kept
    assert len(monitor._recent) == 1
    monitor.record(3.0, now=1070.0)
    assert [lag for _, lag in monitor._recent] == [3.0]
    assert monitor.stalls_total == 1 and monitor.worst_ms == 120.0
