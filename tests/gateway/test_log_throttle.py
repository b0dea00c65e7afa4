"""One log line per fault, not one per request."""

from __future__ import annotations

import logging

from gateway.log_throttle import LogThrottle


def test_one_line_per_interval_and_the_held_back_count(caplog, monkeypatch) -> None:  # noqa: ANN001
    import gateway.log_throttle as lt

    clock = [100.0]
    monkeypatch.setattr(lt.time, "monotonic", lambda: clock[0])
    log = logging.getLogger("pagegate.test-throttle")
    throttle = LogThrottle(every_s=10)
    with caplog.at_level(logging.WARNING, logger=log.name):
        written = [throttle.log(log, logging.WARNING, "redis down: %s", i) for i in range(500)]
        clock[0] += 10.5
        throttle.log(log, logging.WARNING, "redis down: %s", "again")
        # a line held back, then a new fault minutes later: the count is dated, not "in the last 10 s"
        # (found by QA: the first line of an outage counted 141 refusals of one 3.5 minutes before)
        throttle.log(log, logging.WARNING, "redis down: %s", "held")
        clock[0] += 210
        throttle.log(log, logging.WARNING, "redis down: %s", "later")
    assert written[0] and not any(written[1:])
    assert [r.getMessage() for r in caplog.records] == [
        "redis down: 0", "redis down: again (and 499 more like it in the last 10 s)",
        "redis down: later (and 1 more like it in the 10 s after the previous line, 210 s ago)"]


def test_a_log_throttle_reset_forgets_the_fault_it_held_back():
    """Found by a re-check QA: the lease renewal's warning for a second Redis outage said "and 3
    more like it", counting lines of the first one; a renewal that succeeds resets the throttle."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("pagegate.test.throttle")
    logger.addHandler(Keep())
    throttle = LogThrottle(60.0)
    for _ in range(4):
        throttle.log(logger, logging.WARNING, "down")
    throttle.reset()
    assert throttle.log(logger, logging.WARNING, "down again")
    assert lines == ["down", "down again"]
