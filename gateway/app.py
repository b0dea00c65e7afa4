"""The FastAPI app factory. ``create_app(settings)`` builds everything the gateway needs in its
lifespan and tears it down in reverse order:

    Redis url (PAGEGATE_REDIS_URL, else an embedded Redis server)
    → tenancy services (database, Redis client, auth, limits, quota, usage writer, prices)
    → engine (in-process AsyncEngine, or ``engine.remote_engine.RemoteEngine`` when ``engine_socket`` names an
      engine process; none when handed one or ``load_engine=False``)
    → semantic cache (when ``cache_enabled``)
    → per-client-IP limit on /v1 (slowapi, when ``ip_rpm`` > 0)
    → the event loop's lag, watched (``gateway.loop_lag``: /metrics, a warning in the log)
    → garbage collector: what is alive now frozen out of its sight (``gateway.heap``)

Tests hand in their own ``engine`` (shared by the session) or ``services``; what is handed in is
not started or stopped here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi import FastAPI

from engine.protocol import EngineClient
from gateway.deps import AppState
from gateway.error_handlers import install_error_handlers
from gateway.flights import Flights
from gateway.heap import tune_gc
from gateway.loop_lag import LoopLagMonitor
from gateway.middleware import GatewayMiddleware, Unanswered
from gateway.probes import DependencyProbe, database_state
from gateway.routes import DIRECT, ROUTERS
from gateway.settings import Settings

log = logging.getLogger("pagegate.app")

# what a page may read of a response: the request id, the rate-limit and cache headers
CORS_EXPOSED_HEADERS = [
    "x-request-id", "retry-after", "retry-after-ms", "x-should-retry", "x-cache", "x-cache-similarity",
    "x-cache-coalesced",
    *(f"x-ratelimit-{what}-{unit}" for unit in ("requests", "tokens") for what in ("limit", "remaining", "reset")),
]


async def _build_engine(settings: Settings) -> EngineClient:
    if settings.engine_socket:  # a worker of `pagegate serve --workers N`: the engine has its own process
        from engine.remote_engine import RemoteEngine

        remote = RemoteEngine(settings.engine_socket)
        await remote.start()  # waits for the engine process to listen; loads the tokenizer here
        # the engine's connection lost for good: this worker stops (gracefully) and its supervisor
        # starts it again, or stops the service if the engine process is gone
        remote.on_lost = lambda: os.kill(os.getpid(), signal.SIGTERM)
        return remote
    from engine.async_engine import AsyncEngine

    engine = AsyncEngine(settings.engine_config())
    await engine.start()  # loads the weights on a worker thread
    return engine


def _build_cache(settings: Settings, redis: Any) -> Any:
    try:
        from cache import build_cache  # type: ignore[attr-defined]
    except ImportError:
        try:
            from cache.client import build_cache  # type: ignore[no-redef]
        except ImportError:
            log.warning("semantic cache enabled but cache.build_cache is not available; running without")
            return None
    return build_cache(settings, redis)


def apply_gil_switch_interval(settings: Settings) -> None:
    """The engine steps on its own thread and shares the GIL with the event loop: when the loop
    wakes (a socket is ready, a reply came) it waits for the GIL up to the switch interval before
    the engine's thread must hand it over. Python's 5 ms default shows as event-loop stalls while
    the engine steps; ``settings.gil_switch_interval_ms`` (1 ms) bounds each wait lower."""
    if settings.gil_switch_interval_ms > 0:
        sys.setswitchinterval(settings.gil_switch_interval_ms / 1000)


def _own_figures(state: AppState) -> dict:
    return {"loop": state.loop_lag.snapshot() if state.loop_lag is not None else None,
            "cache": state.cache_stats(),
            "embedder": state.embedder_stats(),
            "database": database_state(state.services)}


def create_app(settings: Settings, *, engine: EngineClient | None = None, services: Any = None,
               cache: Any = None, embedder: Any = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(sys.setswitchinterval, sys.getswitchinterval())
            apply_gil_switch_interval(settings)
            svc = services
            if svc is None:
                redis_url = settings.redis_url
                if redis_url is None:
                    from gateway.redis_server import EmbeddedRedis

                    embedded = EmbeddedRedis(settings.data_dir)
                    redis_url = await asyncio.to_thread(embedded.start)
                    stack.push_async_callback(asyncio.to_thread, embedded.stop)
                from gateway.tenancy_services import build_tenancy

                svc = await build_tenancy(settings, redis_url=redis_url)
                stack.push_async_callback(svc.close)
            eng = engine
            if eng is None and settings.load_engine:
                eng = await _build_engine(settings)
                stack.push_async_callback(eng.shutdown)
            semantic_cache = cache
            if semantic_cache is None and settings.cache_enabled:
                semantic_cache = await _maybe_await(_build_cache(settings, svc.redis))
                if semantic_cache is not None:
                    stack.push_async_callback(semantic_cache.close)
            ip_limiter = None
            if settings.ip_rpm > 0 and getattr(svc, "redis_url", ""):
                from gateway.ip_limit import ClientIPLimiter

                ip_limiter = ClientIPLimiter(svc.redis_url, prefix=settings.redis_prefix, rpm=settings.ip_rpm,
                                             redis=getattr(svc, "redis", None))
                stack.push_async_callback(ip_limiter.aclose)
                app.state.limiter = ip_limiter.limiter  # slowapi's convention
            loop_lag = LoopLagMonitor()
            loop_lag.start()
            stack.push_async_callback(loop_lag.stop)
            probe = DependencyProbe(svc)
            stack.push_async_callback(probe.aclose)
            state = AppState(settings=settings, engine=eng, services=svc, cache=semantic_cache, embedder=embedder,
                             ip_limiter=ip_limiter, loop_lag=loop_lag, probe=probe,
                             flights=Flights() if semantic_cache is not None and settings.cache_coalesce else None)
            app.state.pagegate = state
            counted = getattr(svc, "metrics", None)
            if counted is not None:  # this process's own figures, for /metrics and the workers' files
                counted.process = partial(_own_figures, state)
            stack.callback(tune_gc(settings))
            try:
                yield
            finally:
                if embedder is None and state.embedder is not None:
                    state.embedder.close()

    # no 307 to the URL without its trailing slash: an unknown URL is a 404 in OpenAI's shape
    # the OpenAPI document stays (/openapi.json, for client generators); no /docs or /redoc pages:
    # they load their scripts from a CDN (found by QA: undocumented, and useless offline)
    app = FastAPI(title="pagegate", version="0.1.0", lifespan=lifespan, redirect_slashes=False,
                  description="OpenAI-compatible multi-tenant LLM gateway", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.state.unanswered = Unanswered()  # requests without a response yet (gateway.shutdown)
    # dev mode on the public secret: only requests addressed to this machine by name (a page of
    # another site reaching it through DNS rebinding mints admin tokens with that secret)
    app.add_middleware(GatewayMiddleware, max_bytes=settings.max_request_bytes, direct=DIRECT,
                       unanswered=app.state.unanswered,
                       loopback_hosts_only=settings.dev_mode and settings.placeholder_admin_secret)
    origins = [o.strip().rstrip("/") for o in settings.cors_allow_origins.split(",") if o.strip()]
    if origins:  # outermost: a preflight is answered before any limit or key check
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "PATCH", "PUT", "DELETE"],  # the admin API's too
                           allow_headers=["*"],  # the SDKs send their own (x-stainless-*, openai-*)
                           expose_headers=CORS_EXPOSED_HEADERS, max_age=600)
    for router in ROUTERS:
        app.include_router(router)
    admin_router = _admin_router(settings)
    if admin_router is not None:
        app.include_router(admin_router)
    return app


def _admin_router(settings: Settings) -> Any:
    """The admin API and dashboard (``admin.build_admin_router``), when that package provides it."""
    try:
        from admin import build_admin_router
    except ImportError:
        return None
    return build_admin_router(settings)


async def _maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value):
        return await value
    return value
