"""Request counters and latency histograms, and ``GET /metrics`` in Prometheus's text format.

Every request that reaches its usage row is counted here too (``RequestAccount`` calls
``observe``): requests by endpoint, model, status and cache outcome; prompt, cached prompt and
completion tokens and cost by model and tenant; latency and time to first token as histograms.
A few dictionary updates a request, on the event loop, nothing awaited.

With ``pagegate serve --workers N`` each worker counts its own requests, and a scrape reaches one
of them. So that every scrape shows the whole service, each worker writes its counters to
``<dir>/w<index>.json`` every second (``PAGEGATE_METRICS_DIR``, set by the supervisor) and a
scrape writes the answering worker's file, then sums every worker's file: a scrape shows only
what is in the files, each of which only grows, so no sum ever goes down, whichever worker
answers (found by QA: live counts plus the others' files went back and forth between workers,
which Prometheus reads as counter resets). A worker that is started again reads its own file
back first; what it counted since its last write before dying is lost. Per-process figures (the
event loop's, the semantic cache's) come from each worker's file with a ``worker`` label.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("pagegate.metrics")

# seconds: from well under a cache hit to a long generation
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DUMP_INTERVAL_S = 1.0

_COUNTERS = {  # name: (help, label names)
    "pagegate_requests_total": ("Requests that ended, by endpoint, model, status and semantic-cache outcome",
                                ("endpoint", "model", "status", "cache")),
    "pagegate_prompt_tokens_total": ("Prompt tokens of the requests", ("model", "tenant")),
    "pagegate_cached_prompt_tokens_total": ("Prompt tokens served from the engine's prefix cache",
                                            ("model", "tenant")),
    "pagegate_completion_tokens_total": ("Completion tokens of the requests", ("model", "tenant")),
    "pagegate_cost_usd_total": ("Money billed (USD; semantic-cache hits bill nothing)", ("model", "tenant")),
    "pagegate_saved_usd_total": ("Money semantic-cache hits saved (USD)", ("model", "tenant")),
}
_BY_TENANT = ("pagegate_prompt_tokens_total", "pagegate_cached_prompt_tokens_total", "pagegate_completion_tokens_total",
              "pagegate_cost_usd_total", "pagegate_saved_usd_total")  # a row's sums after its request count
_MONEY = frozenset({"pagegate_cost_usd_total", "pagegate_saved_usd_total"})
_HISTOGRAMS = {  # name: (help, label names, buckets)
    "pagegate_request_latency_seconds": ("Time from the request's arrival to its end", ("endpoint",),
                                         LATENCY_BUCKETS),
    "pagegate_time_to_first_token_seconds": ("Time from the request's arrival to its first token",
                                             ("endpoint",), TTFT_BUCKETS),
}


class RequestMetrics:
    """This process's counters (``observe``), and with a directory the other workers' (``scrape``).
    Kept as one row of sums per (endpoint, model, tenant, status, cache outcome) and one histogram
    per endpoint, so that a request costs two dictionary lookups (~2 µs); the metric families are
    made from them when scraped."""

    def __init__(self, directory: str | Path | None = None, worker: str | None = None) -> None:
        # (endpoint, model, tenant, status, cache) -> [requests, prompt, cached, completion, cost, saved]
        self.rows: dict[tuple, list[float]] = {}
        # histogram name -> endpoint -> per bucket (not cumulative), +Inf overflow, sum, count
        self.histograms: dict[str, dict[str, list[float]]] = {name: {} for name in _HISTOGRAMS}
        self.responses: dict[tuple[str, str], int] = {}  # (route, status) -> HTTP responses sent
        self.directory = Path(directory) if directory else None
        self.worker = worker or str(os.getpid())
        # this process's own figures for the exposition (the event loop's lag, the cache's counters),
        # set by the app: {"loop": LoopLagMonitor.snapshot() | None, "cache": stats | None}
        self.process: Callable[[], dict] | None = None
        self._task: asyncio.Task | None = None
        # states are numbered as they are taken (on the event loop) and written in that order: the
        # periodic write and a scrape's run on threads at once, and an older state written after a
        # newer one would take the file (and the sums) back
        self._taken = 0
        self._written = 0
        self._write_lock = threading.Lock()
        if self.directory is not None:
            self._load_own()

    # -- counting ----------------------------------------------------------------------
    def observe(self, *, endpoint: str, model: str, tenant: int | str, status: str, cache: str | None,
                prompt_tokens: int, cached_prompt_tokens: int, completion_tokens: int, cost_usd: float,
                saved_usd: float, latency_s: float, ttft_s: float | None) -> None:
        key = (endpoint, model, str(tenant), status, cache or "none")
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0, 0, 0, 0, 0.0, 0.0]
        row[0] += 1
        row[1] += prompt_tokens
        row[2] += cached_prompt_tokens
        row[3] += completion_tokens
        row[4] += cost_usd
        row[5] += saved_usd
        _time(self.histograms["pagegate_request_latency_seconds"], endpoint, LATENCY_BUCKETS, latency_s)
        if ttft_s is not None:
            _time(self.histograms["pagegate_time_to_first_token_seconds"], endpoint, TTFT_BUCKETS, ttft_s)

    def count_response(self, path: str, status: int) -> None:
        """Every HTTP response, by route and status (refusals included: a 401, a 429 has no usage row)."""
        key = (route_of(path), str(status))
        self.responses[key] = self.responses.get(key, 0) + 1

    def families(self) -> dict[str, dict[tuple, float]]:
        """The counters by metric and labels (``_COUNTERS``), summed from the rows."""
        out: dict[str, dict[tuple, float]] = {name: {} for name in _COUNTERS}
        for (endpoint, model, tenant, status, cache), row in self.rows.items():
            _add(out["pagegate_requests_total"], (endpoint, model, status, cache), row[0])
            by = (model, tenant)
            for name, value in zip(_BY_TENANT, row[1:], strict=True):
                if value:
                    _add(out[name], by, value)
        return out

    # -- several workers ---------------------------------------------------------------
    def state(self) -> dict:
        """A copy of the counters (and this process's own figures), safe to use off the event loop."""
        self._taken += 1
        return {"seq": self._taken,
                "rows": [[list(k), list(v)] for k, v in self.rows.items()],
                "histograms": {n: {e: list(v) for e, v in h.items()} for n, h in self.histograms.items()},
                "responses": [[list(k), v] for k, v in self.responses.items()],
                "process": self.process() if self.process is not None else None}

    def _absorb(self, state: dict) -> None:
        for labels, value in state.get("responses", []):
            if len(labels) == 2:
                key = (str(labels[0]), str(labels[1]))
                self.responses[key] = self.responses.get(key, 0) + value
        for labels, values in state.get("rows", []):
            if len(labels) != 5 or len(values) != 6:
                continue
            row = self.rows.setdefault(tuple(labels), [0, 0, 0, 0, 0.0, 0.0])
            for i, v in enumerate(values):
                row[i] += v
        for name, series in state.get("histograms", {}).items():
            if name in self.histograms:
                width = len(_HISTOGRAMS[name][2]) + 3
                for endpoint, values in series.items():
                    if len(values) != width:
                        continue  # written with other buckets: left out rather than misread
                    mine = self.histograms[name].setdefault(endpoint, [0.0] * width)
                    for i, v in enumerate(values):
                        mine[i] += v

    def _own_file(self) -> Path:
        assert self.directory is not None
        return self.directory / f"w{self.worker}.json"

    def _load_own(self) -> None:
        try:
            self._absorb(json.loads(self._own_file().read_text()))
        except FileNotFoundError:  # this worker's first start
            pass
        except (OSError, ValueError) as exc:
            log.warning("metrics: could not read %s back (%s); this worker's counters start at 0",
                        self._own_file(), exc)

    def dump(self, state: dict | None = None) -> None:
        """Write this worker's counters (atomically: a reader never sees half a file); ``state``:
        taken on the event loop (``state()``) when this runs on a thread."""
        if self.directory is None:
            return
        state = self.state() if state is None else state
        path = self._own_file()
        with self._write_lock:
            if state["seq"] <= self._written:
                return  # a newer state is in the file already
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, path)
            self._written = state["seq"]

    def scrape(self, own: dict) -> tuple[RequestMetrics, list[tuple[str | None, dict]]]:
        """The counters to show and each process's own figures (worker, figures), from ``own``
        (``state()``, taken on the event loop): with a directory, written to this worker's file
        first, then every worker's file summed. Reads and writes files: call it on a thread."""
        total = RequestMetrics()
        if self.directory is None:
            total._absorb(own)
            return total, [(None, own.get("process") or {})]
        try:
            self.dump(own)
        except OSError as exc:  # the sums still come from the files; this worker's may be a second old
            log.warning("metrics: could not write %s: %s", self._own_file(), exc)
        processes: list[tuple[str | None, dict]] = []
        for path in sorted(self.directory.glob("w*.json")):
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):  # gone, or not ours: the next scrape has it
                continue
            total._absorb(state)
            processes.append((path.stem[1:], state.get("process") or {}))
        return total, processes

    def start(self) -> None:
        if self.directory is not None and self._task is None:
            self._task = asyncio.ensure_future(self._dump_every())

    async def _dump_every(self) -> None:
        while True:
            await asyncio.sleep(DUMP_INTERVAL_S)
            try:
                await asyncio.to_thread(self.dump, self.state())
            except (OSError, TypeError, ValueError) as exc:
                log.warning("metrics: could not write %s: %s", self._own_file(), exc)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        with contextlib.suppress(OSError):
            self.dump()


_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/health", "/metrics")


def route_of(path: str) -> str:
    """A response's ``route`` label: the API route its path falls under (``/v1/models/x`` is
    ``/v1/models``; the admin API, ``/admin/v1/…``, is ``/admin``; the dashboard's pages, the rest
    of ``/admin/…``, are ``/dashboard``: found by QA, they were counted as ``/admin`` and the
    documented ``/dashboard`` never came), else ``other``: never the raw path, which anyone can make up."""
    for route in _ROUTES:
        if path == route or path.startswith(route + "/"):
            return route
    if path == "/admin/v1" or path.startswith("/admin/v1/"):
        return "/admin"
    if path == "/admin" or path.startswith("/admin/"):
        return "/dashboard"
    return "other"


def _add(series: dict, labels: tuple, value: float) -> None:
    series[labels] = series.get(labels, 0) + value


def _time(series: dict[str, list[float]], endpoint: str, buckets: tuple[float, ...], value: float) -> None:
    counts = series.get(endpoint)
    if counts is None:
        counts = series[endpoint] = [0.0] * (len(buckets) + 3)
    counts[bisect_left(buckets, value)] += 1  # the first bucket whose bound is >= value; past all: +Inf's
    counts[-2] += value
    counts[-1] += 1


# ---------------------------------------------------------------------------------- exposition

_ENGINE_GAUGES = {  # EngineStats field: (metric, help, type)
    "running": ("pagegate_engine_running_sequences", "Sequences in the running batch", "gauge"),
    "waiting": ("pagegate_engine_waiting_sequences", "Sequences waiting to be admitted", "gauge"),
    "kv_blocks_total": ("pagegate_engine_kv_blocks", "KV cache blocks in the pool", "gauge"),
    "kv_blocks_used": ("pagegate_engine_kv_blocks_used", "KV cache blocks in use", "gauge"),
    "kv_usage": ("pagegate_engine_kv_usage_ratio", "Fraction of KV cache blocks in use", "gauge"),
    "prefix_hit_rate": ("pagegate_engine_prefix_hit_ratio",
                        "Prompt tokens served from the prefix cache / prompt tokens looked up", "gauge"),
    "preemptions": ("pagegate_engine_preemptions_total",
                    "Sequences preempted (pool full, or a slot given to a less-served tenant)", "counter"),
    "steps": ("pagegate_engine_steps_total", "Engine steps", "counter"),
    "generated_tokens": ("pagegate_engine_generated_tokens_total", "Tokens the engine generated", "counter"),
}

_CACHE_COUNTERS = ("lookups", "hits", "semantic_hits", "misses", "bypasses", "verifier_rejections", "stores",
                   "evictions", "redis_errors", "embed_errors", "coalesced", "coalesce_fallbacks")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT_FORMATS = ("prometheus", "text", "openmetrics")
FORMATS = TEXT_FORMATS + ("json",)


def wants_prometheus(accept: str | None, fmt: str | None) -> bool:
    """``?format=prometheus``, or an ``Accept`` that prefers Prometheus's formats (``text/plain``,
    ``application/openmetrics-text``) to JSON by its q-values: what Prometheus's scraper sends. A
    tie, ``*/*``, a browser's and JSON keep the JSON answer (found by QA: axios's default
    ``application/json, text/plain, */*`` got the text)."""
    if fmt is not None:  # the route refuses any other value first (``FORMATS``)
        return fmt.strip().lower() in TEXT_FORMATS
    text_q = json_q = 0.0
    for part in (accept or "").lower().split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media in ("text/plain", "application/openmetrics-text"):
            text_q = max(text_q, q)
        elif media == "application/json":
            json_q = max(json_q, q)
    return text_q > 0 and text_q > json_q


def render(*, uptime_s: float, engine: dict | None, engine_up: bool, model: str | None,
           processes: list[tuple[str | None, dict]], requests: RequestMetrics,
           dependencies: dict | None = None) -> str:
    """``processes``: (worker, {"loop": ..., "cache": ..., "database": ...}) per process, as
    ``RequestMetrics.scrape`` gives them; with workers their series carry a ``worker`` label.
    ``dependencies``: the answering process's ``DependencyProbe.check()`` (Redis's write probe, the spool's
    files)."""
    out: list[str] = []

    def family(name: str, help_text: str, kind: str) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")

    if model is not None:  # no engine in this process (PAGEGATE_LOAD_ENGINE=false): no series, rather
        # than a 0 that an alert on ``pagegate_up == 0`` would fire on for a healthy process (found by QA)
        family("pagegate_up", "1 while the engine steps (0: its loop stopped)", "gauge")
        out.append(f"pagegate_up{_labels(('model',), (model,))} {1 if engine_up else 0}")
    family("pagegate_uptime_seconds", "Seconds since this process's app started", "gauge")
    out.append(f"pagegate_uptime_seconds {_num(uptime_s)}")
    if engine:
        for field_name, (name, help_text, kind) in _ENGINE_GAUGES.items():
            if field_name in engine:
                family(name, help_text, kind)
                out.append(f"{name} {_num(engine[field_name])}")
    loops = [(w, p["loop"]) for w, p in processes if p.get("loop")]
    if loops:
        family("pagegate_event_loop_lag_max_seconds", "Longest event-loop lag over the last minute, per process",
               "gauge")
        for worker, lag in loops:
            out.append(f"pagegate_event_loop_lag_max_seconds{_worker(worker)} "
                       f"{_num(lag['lag_ms_max_last_minute'] / 1000)}")
        family("pagegate_event_loop_stalls_total", "Event-loop stalls over the threshold, per process", "counter")
        for worker, lag in loops:
            out.append(f"pagegate_event_loop_stalls_total{_worker(worker)} {_num(lag['stalls_total'])}")
    _dependency_gauges(family, out, processes, dependencies or {})
    caches = [(w, p["cache"]) for w, p in processes if p.get("cache")]
    if caches:
        family("pagegate_cache_events_total", "Semantic cache events, per process", "counter")
        for worker, cache in caches:
            for event in _CACHE_COUNTERS:
                if event in cache:
                    names, values = ("event",), (event,)
                    if worker is not None:
                        names, values = ("worker", "event"), (worker, event)
                    out.append(f"pagegate_cache_events_total{_labels(names, values)} {_num(cache[event])}")
    _embedder_series(family, out, processes)
    family("pagegate_http_responses_total", "HTTP responses sent, by route and status", "counter")
    for (route, status), value in sorted(requests.responses.items()):
        out.append(f"pagegate_http_responses_total{_labels(('route', 'status'), (route, status))} {_num(value)}")
    counters = requests.families()
    for name, (help_text, label_names) in _COUNTERS.items():
        family(name, help_text, "counter")
        for labels, value in sorted(counters[name].items()):
            if name in _MONEY:  # rows bill to 1e-8 USD: a float sum's last bits are not money (QA)
                value = round(value, 10)
            out.append(f"{name}{_labels(label_names, labels)} {_num(value)}")
    for name, (help_text, label_names, buckets) in _HISTOGRAMS.items():
        family(name, help_text, "histogram")
        for endpoint, series in sorted(requests.histograms[name].items()):
            labels = (endpoint,)
            running = 0.0
            for bound, count in zip(buckets, series, strict=False):
                running += count
                out.append(f"{name}_bucket{_labels((*label_names, 'le'), (*labels, _num(bound)))} {_num(running)}")
            out.append(f"{name}_bucket{_labels((*label_names, 'le'), (*labels, '+Inf'))} {_num(series[-1])}")
            out.append(f"{name}_sum{_labels(label_names, labels)} {_num(series[-2])}")
            out.append(f"{name}_count{_labels(label_names, labels)} {_num(series[-1])}")
    return "\n".join(out) + "\n"


def _embedder_series(family: Callable, out: list[str], processes: list[tuple[str | None, dict]]) -> None:
    embedders = [(w, p["embedder"]) for w, p in processes if p.get("embedder")]
    if not embedders:
        return
    family("pagegate_embedder_busy_seconds_total", "Seconds of the embedder's thread by work (lookups, "
           "embeddings per tenant, prefill), per process", "counter")
    for worker, emb in embedders:
        for work, tenant, seconds in emb["busy"]:
            names, values = ("work", "tenant") if tenant else ("work",), (work, tenant) if tenant else (work,)
            if worker is not None:
                names, values = ("worker", *names), (worker, *values)
            out.append(f"pagegate_embedder_busy_seconds_total{_labels(names, values)} {_num(seconds)}")
    family("pagegate_embedder_jobs_waiting", "Jobs waiting for the embedder's thread, per process", "gauge")
    for worker, emb in embedders:
        out.append(f"pagegate_embedder_jobs_waiting{_worker(worker)} {_num(emb['waiting'])}")


def _dependency_gauges(family: Callable, out: list[str], processes: list[tuple[str | None, dict]],
                       dependencies: dict) -> None:
    redis = dependencies.get("redis")
    if redis is not None:
        family("pagegate_redis_up", "1 when Redis takes a write from this process within 1 s", "gauge")
        out.append(f"pagegate_redis_up {1 if redis.get('status') == 'ok' else 0}")
    writers = [(w, p["database"]) for w, p in processes if p.get("database")]
    if writers:
        family("pagegate_database_up", "0 from a failed usage-row insert or key lookup until one succeeds, per "
               "process", "gauge")
        for worker, db in writers:
            out.append(f"pagegate_database_up{_worker(worker)} {1 if db.get('status') == 'ok' else 0}")
        family("pagegate_usage_rows_waiting", "Usage rows recorded but not yet known to be in the database, per "
               "process", "gauge")
        for worker, db in writers:
            out.append(f"pagegate_usage_rows_waiting{_worker(worker)} {_num(db.get('rows_waiting', 0))}")
    files = (dependencies.get("database") or {}).get("spool_files")
    if files is not None:
        family("pagegate_usage_spool_files", "Usage spool files waiting for the database (all processes)", "gauge")
        out.append(f"pagegate_usage_spool_files {_num(files)}")


def _worker(worker: str | None) -> str:
    return "" if worker is None else _labels(("worker",), (worker,))


def _labels(names: tuple, values: tuple) -> str:
    return "{" + ",".join(f'{n}="{_escape(str(v))}"' for n, v in zip(names, values, strict=True)) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 2**53):
        return str(int(value))
    return format(float(value), ".15g")  # (sums of costs: 0.000113, not 0.00011300000000000001; QA)


