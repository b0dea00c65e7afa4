"""Where a wave's time goes, on the engine's clock (``bench/gateway_overhead.py --timeline``).

In waves every client has one request in each engine step, so what happens between one step's end
and the next step's start is the whole critical path: the outputs reach the clients, each client
finishes its request (price, usage row) and starts the next one, the admission batches go to Redis
and come back, the requests reach the engine, and the engine gathers the burst before it steps.
``WaveTimeline`` records when each of those happens (``perf_counter``, in-process marks; the
admission batches by wrapping the coalescers' batch functions) and prints, per phase, the median
over the waves of when the first and the last of each event happened, in ms after the previous
step ended::

    event                                          first     last
    outputs reach the clients                       0.33     1.55
    requests start (after the previous one's row)   0.55     1.58
    per-address batch in Redis                      1.59 ->  2.03
    ...
    next engine step starts                         5.78

The marks cost ~0.1 µs each and are taken only with ``--timeline``."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable

# event label -> the line it is printed as (in time order of a wave, as the bench produces them)
LABELS = {
    "out": "outputs reach the clients",
    "start": "requests start (after the previous one's row)",
    "admitted": "requests reach the engine",
    "gather": "step thread gathers the burst (from idle)",
    "gathered": "step thread stops gathering",
    "added": "step thread adds the requests",
}


class WaveTimeline:
    def __init__(self) -> None:
        self.events: list[tuple[str, float]] = []
        self.phase_events: dict[str, list[tuple[str, float]]] = defaultdict(list)

    def mark(self, label: str) -> None:
        self.events.append((label, time.perf_counter()))

    def watch(self, coalescer, name: str) -> None:  # noqa: ANN001 - gateway.coalesce.Coalescer
        """Mark when each batch of ``coalescer`` goes to Redis and when its results are back."""
        run: Callable = coalescer._run

        async def timed(key, items):  # noqa: ANN001, ANN202
            self.mark(f"{name} sent")
            try:
                return await run(key, items)
            finally:
                self.mark(f"{name} back")

        coalescer._run = timed

    def watch_engine(self, engine) -> None:  # noqa: ANN001 - engine.async_engine.AsyncEngine
        """Mark, on the step thread, when it starts and stops gathering a burst and when it adds
        each request to the scheduler (the part of the wave after the requests are handed over)."""
        burst, llm = engine._burst, engine.engine
        gather, add = burst.gather, llm.add_request

        def timed_gather(stopping, *, resume=False):  # noqa: ANN001, ANN202
            if not resume:
                self.mark("gather")
            tail = False
            try:
                tail = gather(stopping, resume=resume)
                return tail
            finally:
                if not tail:  # (a quiet tail left: the requests are applied before it is waited out)
                    self.mark("gathered")

        def timed_add(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            self.mark("added")
            return add(*args, **kwargs)

        burst.gather = timed_gather
        llm.add_request = timed_add

    def end_phase(self, mode: str) -> None:
        self.phase_events[mode] += self.events
        self.events = []

    def report(self, mode: str, spans: list[tuple[float, float]], *, max_gap_ms: float = 50.0) -> None:
        """``spans``: the phase's engine steps (start, end); only gaps shorter than ``max_gap_ms``
        count as waves (a longer one is the end of a phase)."""
        events = sorted(self.phase_events.get(mode, []), key=lambda e: e[1])
        per_label: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"first": [], "last": []})
        nxt: list[float] = []
        i = 0
        for prev, step in zip(spans, spans[1:], strict=False):
            end, start = prev[1], step[0]
            while i < len(events) and events[i][1] < end:
                i += 1
            j = i
            first: dict[str, float] = {}
            last: dict[str, float] = {}
            while j < len(events) and events[j][1] <= start:
                label, t = events[j]
                first.setdefault(label, t)
                last[label] = t
                j += 1
            if (start - end) * 1000 > max_gap_ms or "start" not in first:
                continue
            for label in first:
                per_label[label]["first"].append((first[label] - end) * 1000)
                per_label[label]["last"].append((last[label] - end) * 1000)
            nxt.append((start - end) * 1000)
        if not nxt:
            return
        print(f"\nWhere a wave's time goes ({mode}; medians over {len(nxt)} waves, ms after the previous step ended):")
        print(f"  {'event':<48}{'first':>8}{'last':>9}")
        rows = sorted(per_label.items(), key=lambda kv: statistics.median(kv[1]["first"]))
        for label, v in rows:
            first, last = statistics.median(v["first"]), statistics.median(v["last"])
            if label.endswith(" sent"):
                back = per_label.get(label[:-5] + " back")
                end = f"-> {statistics.median(back['last']):5.2f}" if back else ""
                print(f"  {label[:-5] + ' batch in Redis':<48}{first:>8.2f}  {end}")
            elif label.endswith(" back"):
                continue
            else:
                print(f"  {LABELS.get(label, label):<48}{first:>8.2f}{last:>9.2f}")
        print(f"  {'next engine step starts':<48}{statistics.median(nxt):>8.2f}")
