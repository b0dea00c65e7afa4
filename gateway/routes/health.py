"""GET /health (liveness + engine stats, no auth; HEAD as well, for load balancers) and GET
/metrics (the same, as JSON numbers, with the event loop's lag: ``gateway.loop_lag``, and the
semantic cache's counters)."""

import dataclasses
import os
import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.deps import StateDep

router = APIRouter(tags=["health"])


def _engine_stats(state) -> dict | None:  # noqa: ANN001 - AppState
    if state.engine is None:
        return None
    if getattr(state.engine, "is_dead", False):
        raise RuntimeError("the engine's step loop has stopped")
    return dataclasses.asdict(state.engine.stats())


@router.get("/health")
@router.head("/health", include_in_schema=False)  # load balancers' HEAD checks: the status alone
async def health(state: StateDep) -> JSONResponse:
    try:
        stats = _engine_stats(state)
    except Exception:  # a dead engine: say so, with 503 so load balancers take the process out
        return JSONResponse({"status": "unavailable", "model": state.engine.model_id if state.engine else None},
                            status_code=503)
    return JSONResponse({"status": "ok", "model": state.engine.model_id if state.engine else None,
                         "engine": stats})


@router.get("/metrics")
async def metrics(state: StateDep) -> JSONResponse:
    try:
        stats = _engine_stats(state)
    except Exception:
        stats = None
    loop_lag = state.loop_lag.snapshot() if state.loop_lag is not None else None
    # with `pagegate serve --workers N` each worker answers for its own event loop (pid tells which)
    cache = state.cache.stats() if state.cache is not None else None  # this process's counters
    return JSONResponse({"uptime_s": round(time.time() - state.started_at, 3), "engine": stats,
                         "event_loop": loop_lag, "cache": cache, "pid": os.getpid()})
