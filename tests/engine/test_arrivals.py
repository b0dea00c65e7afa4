"""The burst gate's quiet tail (``engine.arrivals.BurstGate``): once every announced request is in,
the step thread is handed the burst to apply before the notice gap is waited out."""

import threading
import time

from engine.arrivals import BurstGate


def _gate(notice_gap_ms: float = 50.0) -> tuple[BurstGate, threading.Condition]:
    cv = threading.Condition()
    return BurstGate(cv, gap_ms=100.0, notice_gap_ms=notice_gap_ms, max_wait_ms=5000.0), cv


def _arrive(gate: BurstGate, cv: threading.Condition, notice=None) -> None:  # noqa: ANN001
    with cv:  # as ``AsyncEngine._send``
        if gate.arrived(add=True, notice=notice):
            cv.notify()


def test_the_tail_is_handed_back_then_waited_only_for_what_is_left():
    gate, cv = _gate()
    notices = [gate.announce() for _ in range(3)]
    for n in notices:
        _arrive(gate, cv, n)
    with cv:
        t0 = time.monotonic()
        assert gate.gather(lambda: False) is True  # all in: apply them, then the tail
        gate.taken()
    time.sleep(0.03)  # applying the requests takes 30 ms of the 50 ms tail
    with cv:
        t1 = time.monotonic()
        assert gate.gather(lambda: False, resume=True) is False
        t2 = time.monotonic()
    assert 0.045 <= t2 - t0 < 0.2  # the tail counted from when the burst was in
    assert t2 - t1 < 0.035  # only what was left of it slept


def test_applying_longer_than_the_tail_steps_at_once():
    gate, cv = _gate(notice_gap_ms=5.0)
    n = gate.announce()
    _arrive(gate, cv, n)
    with cv:
        assert gate.gather(lambda: False) is True
    time.sleep(0.02)
    with cv:
        t0 = time.monotonic()
        assert gate.gather(lambda: False, resume=True) is False
        assert time.monotonic() - t0 < 0.004


def test_an_arrival_during_the_tail_is_handed_back_too():
    """A request announced and handed over while the first ones were being applied: the gate hands
    the tail back again (with a new tail from then), so it joins the same step."""
    gate, cv = _gate()
    first = gate.announce()
    _arrive(gate, cv, first)
    with cv:
        assert gate.gather(lambda: False) is True
    late = gate.announce()  # while the step thread applies the first
    with cv:
        t0 = time.monotonic()
        threading.Timer(0.01, _arrive, (gate, cv, late)).start()
        assert gate.gather(lambda: False, resume=True) is True  # waited for it (a notice was open)
        assert time.monotonic() - t0 < 0.04
        assert gate.open_notices == 0
    with cv:
        assert gate.gather(lambda: False, resume=True) is False


def test_unannounced_arrivals_wait_the_full_gap_without_a_tail():
    gate, cv = _gate()
    _arrive(gate, cv)  # no notice
    with cv:
        t0 = time.monotonic()
        assert gate.gather(lambda: False) is False
        assert time.monotonic() - t0 >= 0.095  # a whole gap of silence
