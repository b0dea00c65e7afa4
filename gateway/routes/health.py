"""GET /health (liveness + engine stats + Redis's and the database's state, ``gateway.probes``;
no auth; HEAD as well, for load balancers) and GET /metrics (the same, as JSON numbers, with the
event loop's lag: ``gateway.loop_lag``, the dependencies' errors and the usage backlog, and the
semantic cache's counters; in Prometheus's text format, with the request counters of
``gateway.metrics``, for a scraper's ``Accept`` or ``?format=prometheus``)."""

import asyncio
import dataclasses
import hmac
import os
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.auth import bearer_token
from gateway.deps import StateDep
from gateway.errors import ApiError, invalid_request
from gateway.metrics import FORMATS, PROMETHEUS_CONTENT_TYPE, RequestMetrics, render, wants_prometheus

router = APIRouter(tags=["health"])


def _engine_stats(state) -> dict | None:  # noqa: ANN001 - AppState
    if state.engine is None:
        return None
    if getattr(state.engine, "is_dead", False):
        raise RuntimeError("the engine's step loop has stopped")
    return dataclasses.asdict(state.engine.stats())


@router.get("/health")
@router.head("/health", include_in_schema=False)  # load balancers' HEAD checks: the status alone
async def health(state: StateDep, request: Request) -> JSONResponse:
    model = state.engine.model_id if state.engine else None
    try:
        stats = _engine_stats(state)
    except Exception:  # a dead engine: say so, with 503 so load balancers take the process out
        return JSONResponse({"status": "unavailable", "model": model}, status_code=503)
    if request.method == "HEAD" or state.probe is None:  # HEAD: the status code alone, no PING
        return JSONResponse({"status": "ok", "model": model, "engine": stats})
    # Redis or the database down: 200 and "degraded" (shared by every process, they would take every
    # process out of a load balancer at once); no error text here: /health needs no token
    deps = {name: part["status"] for name, part in (await state.probe.check()).items()}
    status = "ok" if all(v == "ok" for v in deps.values()) else "degraded"
    return JSONResponse({"status": status, "model": model, "engine": stats, "dependencies": deps})


def _exposition(counted: RequestMetrics, own: dict, engine: dict | None, up: bool, model: str | None,
                uptime_s: float, deps: dict) -> str:
    requests, processes = counted.scrape(own)
    return render(uptime_s=uptime_s, engine=engine, engine_up=up, model=model, processes=processes,
                  requests=requests, dependencies=deps)


async def _dependencies(state) -> dict:  # noqa: ANN001 - AppState
    """The probe's findings, with the usage spool's file count (a directory listing: off the loop)."""
    if state.probe is None:
        return {}
    deps = await state.probe.check()
    usage = getattr(state.services, "usage", None)
    if "database" in deps and hasattr(usage, "spool_file_count"):
        deps["database"] = {**deps["database"], "spool_files": await asyncio.to_thread(usage.spool_file_count)}
    return deps


def _metrics_refusal(state, request: Request) -> ApiError | None:  # noqa: ANN001 - AppState
    """With ``PAGEGATE_METRICS_TOKEN`` set, a scrape must carry it as a bearer token (found by QA:
    any tenant could read every tenant's tokens, spend and cache savings, live, from /metrics)."""
    token = state.settings.metrics_token
    if token is None:
        return None
    given = bearer_token(request.headers.get("authorization"))
    if given is not None and hmac.compare_digest(given.encode(), token.encode()):
        return None
    return ApiError(401, "GET /metrics needs the metrics token (PAGEGATE_METRICS_TOKEN) as a bearer token.",
                    "invalid_request_error", "invalid_token", headers={"www-authenticate": "Bearer"})


@router.get("/metrics")
async def metrics(state: StateDep, request: Request) -> Response:
    refusal = _metrics_refusal(state, request)
    if refusal is not None:
        raise refusal
    fmt = request.query_params.get("format")
    if fmt is not None and fmt.strip().lower() not in FORMATS:  # a typo answered JSON without a word (found by QA)
        raise invalid_request(f"format must be one of {', '.join(FORMATS)}; got {fmt[:40]!r}.", param="format")
    try:
        stats = _engine_stats(state)
        up = True
    except Exception:
        stats, up = None, False
    loop_lag = state.loop_lag.snapshot() if state.loop_lag is not None else None
    # with `pagegate serve --workers N` each worker answers for its own event loop (pid tells which)
    cache = state.cache_stats()  # this process's counters
    deps = await _dependencies(state)
    counted = getattr(state.services, "metrics", None)  # with --workers, its `worker` is the series' label
    if wants_prometheus(request.headers.get("accept"), fmt):
        counted = counted or RequestMetrics()
        own = counted.state()  # a copy, on the event loop; the files, the sums and the text off it
        model = state.engine.model_id if state.engine else None
        text = await asyncio.to_thread(_exposition, counted, own, stats, up and state.engine is not None, model,
                                       time.monotonic() - state.started_mono, deps)
        return Response(text, media_type=PROMETHEUS_CONTENT_TYPE)
    return JSONResponse({"uptime_s": round(time.monotonic() - state.started_mono, 3), "engine": stats,
                         "event_loop": loop_lag, "cache": cache, "embedder": state.embedder_stats(),
                         "dependencies": deps, "pid": os.getpid(),
                         "worker": counted.worker if counted is not None and counted.directory else None})
