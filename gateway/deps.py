"""What routes receive: the app's state and the authenticated caller, as ``Annotated`` aliases.

    async def route(body: ..., ctx: CallerDep) -> ...

``authenticate_and_limit`` checks the API key (401/403) and the request-rate limit (429), and
puts the ``x-ratelimit-*`` headers on whatever response the request ends with.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.types import Receive

from engine.protocol import EngineClient
from gateway.errors import ApiError
from gateway.settings import Settings


@dataclass(slots=True)
class AppState:
    """Everything the app built at start; ``app.state.pagegate``."""

    settings: Settings
    engine: EngineClient | None
    services: Any  # gateway.tenancy_services.TenancyServices
    cache: Any = None  # cache.api.SemanticCacheClient | None
    embedder: Any = None  # gateway.embedder.Embedder (or SharedEmbedder over the cache's), on first use
    ip_limiter: Any = None  # gateway.ip_limit.ClientIPLimiter | None (settings.ip_rpm == 0)
    loop_lag: Any = None  # gateway.loop_lag.LoopLagMonitor, while serving
    started_at: float = field(default_factory=time.time)
    _embedder_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def get_embedder(self) -> Any:
        if self.embedder is None:
            async with self._embedder_lock:
                if self.embedder is None:
                    cache_embedder = getattr(self.cache, "embedder", None)
                    if cache_embedder is not None and hasattr(cache_embedder, "embed_many"):
                        from gateway.embedder import SharedEmbedder  # one MiniLM per process

                        self.embedder = await SharedEmbedder.load(cache_embedder)
                    else:
                        from gateway.embedder import Embedder

                        self.embedder = await asyncio.to_thread(Embedder)
        return self.embedder


@dataclass(slots=True)
class Caller:
    """One authenticated request: who, its id, and the headers its response will carry."""

    state: AppState
    principal: Any  # gateway.auth.Principal
    request_id: str
    response_headers: dict[str, str]
    receive: Receive
    cache_control: str | None
    started: float
    notice: Any = None  # engine.arrivals.ArrivalNotice (announce_generation), for generate()


def get_state(request: Request) -> AppState:
    return request.app.state.pagegate


async def authenticate_and_limit(request: Request) -> Caller:
    state: AppState = request.app.state.pagegate
    if state.services is None:
        raise ApiError(503, "The gateway is starting.", "server_error", "unavailable")
    principal = await state.services.auth.authenticate(request.headers.get("authorization"))
    notice = request.state.engine_notice = announce_generation(request, state.engine)
    headers: dict[str, str] = request.state.response_headers
    try:
        headers.update(await state.services.limiter.check_request(principal))
    except BaseException:
        if notice is not None:
            notice.close()
        raise
    return Caller(state=state, principal=principal, request_id=request.state.request_id,
                  response_headers=headers, receive=request.receive,
                  cache_control=request.headers.get("cache-control"),
                  started=getattr(request.state, "started", None) or time.perf_counter(), notice=notice)


GENERATION_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})


def announce_generation(request: Request, engine: EngineClient | None) -> Any:
    """A chat or text completion whose key is valid is announced to the engine here
    (``AsyncEngine.announce``): the idle engine waits for announced requests to finish their
    admission (limits, quota) instead of guessing the end of a burst from gaps between arrivals.
    After the key check, so neither a body still uploading nor a request without a valid key holds
    the engine. The notice goes to ``generate`` (``Caller.notice``); the request context withdraws
    it if the request ends first. None for other routes or an engine that takes no notices."""
    route = request.scope.get("route")
    if request.method != "POST" or getattr(route, "path", None) not in GENERATION_ROUTES:
        return None
    announce = getattr(engine, "announce", None)
    return announce() if announce is not None else None


StateDep = Annotated[AppState, Depends(get_state)]
CallerDep = Annotated[Caller, Depends(authenticate_and_limit)]
