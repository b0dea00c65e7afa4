"""When the step thread, woken from idle, stops waiting for the rest of a burst.

A wave of requests reaches the engine spread over a few milliseconds: each passes its caller's
admission (the gateway's limits and quota) one after the other. Started at the first arrival, the
step would hold a few of them and the rest would wait a whole step. So, woken from idle, the step
thread waits for the burst, in one of two ways:

- **announced arrivals** (the gateway): a caller takes an ``ArrivalNotice`` while a request is
  still in its admission (the gateway: once its key is known) and hands it to ``generate`` (or
  closes it when the request will not come). While notices are open the thread waits for them;
  when the last one is in, it waits only ``notice_gap`` more (for a request whose admission is
  only starting) and steps;
- **unannounced arrivals** (direct callers): it waits while commands keep coming within ``gap`` of
  each other, counted in whole gaps from the first (the end of a burst guessed from silence).

Never longer than ``max_wait`` in all: a notice left open by a slow or stuck admission delays the
requests already in by that much at most. The waits hold no lock, and a hand-over wakes the thread
only when it is the last announced one (one wake-up per burst, not per request: each wake-up
would take the GIL from the event loop handing the requests over)."""

from __future__ import annotations

import threading
import time


class ArrivalNotice:
    """One announced request on its way to the engine. ``close()`` withdraws it (idempotent);
    ``generate(..., notice=)`` consumes it as the request arrives."""

    __slots__ = ("_gate", "open")

    def __init__(self, gate: BurstGate) -> None:
        self._gate = gate
        self.open = True

    def close(self) -> None:
        if self.open:
            self._gate.withdraw(self)

    def __enter__(self) -> ArrivalNotice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a notice dropped open must not hold every burst to max_wait
        if self.open:
            self._gate.withdraw(self)


class BurstGate:
    """The counters behind the two waits. Every method but ``announce``/``withdraw`` is called with
    ``cv`` held (the engine's command condition); ``gather`` releases it while it waits. ``cv`` must
    be reentrant (``threading.Condition()``'s default RLock): a notice's ``__del__`` may run on a
    thread that already holds it (each update under it is a single statement, so re-entering one
    leaves the counts right)."""

    def __init__(self, cv: threading.Condition, *, gap_ms: float, notice_gap_ms: float,
                 max_wait_ms: float) -> None:
        if not isinstance(cv._lock, type(threading.RLock())):  # type: ignore[attr-defined]
            raise TypeError("BurstGate needs a condition over a reentrant lock")
        self._cv = cv
        self.gap = gap_ms / 1000
        self.notice_gap = min(notice_gap_ms, gap_ms) / 1000
        self.max_wait = max_wait_ms / 1000
        self.open_notices = 0
        self._issued = 0  # notices ever taken: a new one during the last wait means a request is coming
        self._arrivals = 0  # commands ever queued
        self._unannounced = 0  # adds queued since the step thread last took the commands, without a notice
        self._gathering = False
        self._deadline = 0.0  # when the current gathering gives up (monotonic)
        self._tail = None  # (arrivals and notices seen, since when) while a quiet tail is being waited

    def announce(self) -> ArrivalNotice:
        with self._cv:
            self.open_notices += 1
            self._issued += 1
        return ArrivalNotice(self)

    def withdraw(self, notice: ArrivalNotice) -> None:
        with self._cv:
            if notice.open:
                notice.open = False
                self.open_notices -= 1
                if self.open_notices == 0 and self._gathering:
                    self._cv.notify()

    def arrived(self, *, add: bool, notice: ArrivalNotice | None) -> bool:
        """(``cv`` held.) A command was queued; True when the step thread should be woken."""
        self._arrivals += 1
        if notice is not None and notice.open:
            notice.open = False
            self.open_notices -= 1
        elif add:
            self._unannounced += 1
        return not self._gathering or self.open_notices == 0

    def taken(self) -> None:
        """(``cv`` held.) The step thread took the queued commands."""
        self._unannounced = 0

    def gather(self, stopping, *, resume: bool = False) -> bool:  # noqa: ANN001 - () -> bool
        """(``cv`` held.) Wait for the rest of the burst that woke the step thread. False: the burst
        is in. True: every announced request is in, and only the notice gap's quiet tail is left
        (for a request whose admission is only starting); the caller takes and applies the commands
        queued so far, then calls ``gather(resume=True)``, which waits only what is left of the
        tail, so that applying the burst's requests overlaps the tail instead of following it (while
        requests are still being handed over, the step thread keeps off the GIL: it waits)."""
        if self.gap <= 0:
            return False
        if not resume:
            self._deadline = time.monotonic() + self.max_wait
            self._tail = None
        self._gathering = True
        try:
            while not stopping():
                now = time.monotonic()
                remaining = self._deadline - now
                if remaining <= 0:
                    return False
                if self.open_notices:  # announced requests on their way: the last hand-over wakes us
                    self._tail = None
                    self._cv.wait(remaining)
                    continue
                seen = (self._arrivals, self._issued)
                if not self._unannounced:  # the quiet tail after announced arrivals
                    tail = self._tail
                    if tail is None or tail[0] != seen:  # (new arrivals: a new tail, from now)
                        self._tail = (seen, now)
                        return True
                    wait = self.notice_gap - (now - tail[1])
                    if wait <= 0:
                        return False  # quiet for the whole tail: the burst is in
                else:
                    wait = self.gap
                self._cv.release()  # a sleep, not a wait: the arrivals' notify must not wake us each
                try:
                    time.sleep(min(wait, remaining))
                finally:
                    self._cv.acquire()
                if (self._arrivals, self._issued) == seen and not self.open_notices:
                    return False  # quiet: the burst is in
            return False
        finally:
            self._gathering = False
