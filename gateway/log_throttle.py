"""One log line per fault, not one per request: while Redis is down every refused request used to
log its own warning (18,771 lines in a 12 s outage), and an unwritable spool one traceback per row."""

from __future__ import annotations

import logging
import time


class LogThrottle:
    """``throttle.log(logger, level, msg, *args)`` logs at most once every ``every_s`` seconds;
    the line says how many like it were held back since the last one."""

    __slots__ = ("every_s", "_next", "_held")

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._next = 0.0
        self._held = 0

    def log(self, logger: logging.Logger, level: int, msg: str, *args: object, exc_info: bool = False) -> bool:
        """True when the line was written."""
        now = time.monotonic()
        if now < self._next:
            self._held += 1
            return False
        if self._held:  # held back in the ``every_s`` after the previous line, which was ``ago`` s before
            ago = now - (self._next - self.every_s)
            if ago <= 2 * self.every_s:
                msg = f"{msg} (and {self._held:,} more like it in the last {self.every_s:g} s)"
            else:  # an earlier fault's (found by QA: an outage's first line counted one 3.5 minutes before)
                msg = (f"{msg} (and {self._held:,} more like it in the {self.every_s:g} s after the previous "
                       f"line, {ago:.0f} s ago)")
        self._held, self._next = 0, now + self.every_s
        logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def reset(self) -> None:
        """The fault is over: the next one's first line is written at once and counts nothing held
        back from this one (found by QA: "and 3 more" counted lines of an outage 95 s before)."""
        self._held, self._next = 0, 0.0
