"""What routes receive: the app's state and the authenticated caller, as ``Annotated`` aliases.

    async def route(body: ..., ctx: CallerDep) -> ...

``authenticate_and_limit`` checks the API key (401/403) and the request-rate limit (429), and
puts the ``x-ratelimit-*`` headers on whatever response the request ends with.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import Receive

from engine.protocol import EngineClient
from gateway.error_handlers import (
    content_type_refusal,
    is_json_content_type,
    key_refusal,
    too_many_digits,
    validation_error,
)
from gateway.errors import ApiError
from gateway.settings import Settings

M = TypeVar("M", bound=BaseModel)


class _TooMany(Exception):
    pass


def holds_too_many_objects(body: bytes, limit: int) -> bool:
    """Whether the JSON body holds more than ``limit`` objects, found by a parse that stops at
    the one past the limit (~3 ms for 16,384 small objects); False for a body that is not JSON
    (its refusal is the parser's, later). A body with no more ``{`` bytes than ``limit`` is not
    parsed at all (found by a re-check: parsing every large body cost up to 0.34 s of the loop
    for 1.25 million numbers, where validation took 54 ms)."""
    if body.count(b"{") <= limit:  # every object opens with one (the rest are in strings): ~1 ms for 8 MB
        return False
    count = 0

    def seen(obj: dict) -> dict:
        nonlocal count
        count += 1
        if count > limit:
            raise _TooMany
        return obj

    try:
        json.loads(body, object_hook=seen)
    except _TooMany:
        return True
    except Exception:  # noqa: BLE001 - not JSON: refused by the parser that follows
        return False
    return False


def too_many_objects(limit: int) -> ApiError:
    return ApiError(400, f"The request holds more than {limit:,} JSON objects (messages, content parts and "
                         "the rest together): more than a chat can use. Join the text parts of a message into "
                         "one, and send fewer messages.", param="messages")


@dataclass(slots=True)
class AppState:
    """Everything the app built at start; ``app.state.pagegate``."""

    settings: Settings
    engine: EngineClient | None
    services: Any  # gateway.tenancy_services.TenancyServices
    cache: Any = None  # cache.api.SemanticCacheClient | None
    flights: Any = None  # gateway.flights.Flights with the cache: identical misses in flight answered once
    embedder: Any = None  # gateway.embedder.Embedder (or SharedEmbedder over the cache's), on first use
    ip_limiter: Any = None  # gateway.ip_limit.ClientIPLimiter | None (settings.ip_rpm == 0)
    loop_lag: Any = None  # gateway.loop_lag.LoopLagMonitor, while serving
    probe: Any = None  # gateway.probes.DependencyProbe: Redis's and the database's state
    started_at: float = field(default_factory=time.time)  # (the models' ``created``)
    started_mono: float = field(default_factory=time.monotonic)  # uptime: a clock step moves it not
    _embedder_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def cache_stats(self) -> dict | None:
        """This process's semantic-cache counters, the coalesced requests' among them; None without a cache."""
        if self.cache is None:
            return None
        return {**self.cache.stats(), **(self.flights.stats() if self.flights is not None else {})}

    def embedder_stats(self) -> dict | None:
        """This process's embedder thread: seconds of it per kind of work (and tenant), and the jobs
        waiting for it; None before an embedder exists. One thread serves the cache and
        /v1/embeddings when the cache is on (``SharedEmbedder``), so it is counted once."""
        workers = {}
        for holder in (getattr(self.cache, "embedder", None), self.embedder,
                       getattr(self.embedder, "inner", None)):
            worker = getattr(holder, "worker", None)
            if worker is not None and hasattr(worker, "busy"):
                workers[id(worker)] = worker
        if not workers:
            return None
        busy: dict[tuple[str, str], float] = {}
        for worker in workers.values():
            for share, seconds in worker.busy.items():
                # lookups (the urgent lane), a tenant's embeddings (its id), a cache prefill (a namespace)
                key = ("lookups", "") if share is None else ("embeddings", str(share)) if isinstance(share, int) \
                    else ("prefill", "")
                busy[key] = busy.get(key, 0.0) + seconds
        return {"busy": [[work, tenant, seconds] for (work, tenant), seconds in sorted(busy.items())],
                "waiting": sum(worker.waiting() for worker in workers.values())}

    async def get_embedder(self) -> Any:
        if self.embedder is None:
            async with self._embedder_lock:
                if self.embedder is None:
                    cache_embedder = getattr(self.cache, "embedder", None)
                    if cache_embedder is not None and hasattr(cache_embedder, "embed_many"):
                        from gateway.embedder import SharedEmbedder  # one MiniLM per process

                        self.embedder = await SharedEmbedder.load(cache_embedder)
                    else:
                        from cache.embedder import resolve_model_path
                        from gateway.embedder import Embedder

                        # the model /v1/models names, as the cache's embedder loads it (found by QA:
                        # without the cache the bundled MiniLM answered whatever the setting said)
                        path = resolve_model_path(self.settings.embedding_model)
                        self.embedder = await asyncio.to_thread(Embedder, path)
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
    principal = request.scope["state"].get("principal")  # checked before the body (gateway.middleware)
    if principal is None:
        principal = await state.services.auth.authenticate(request.headers.get("authorization"),
                                                           query_string=request.scope.get("query_string", b""))
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
                  cache_control=_cache_control(request),
                  started=getattr(request.state, "started", None) or time.perf_counter(), notice=notice)


def _cache_control(request: Request) -> str | None:
    """Every ``Cache-Control`` line, as one list (RFC 9110); without one, ``Pragma: no-cache``
    means ``no-cache`` (RFC 9111 5.4, HTTP/1.0 clients and proxies)."""
    lines = request.headers.getlist("cache-control")
    if lines:
        return ", ".join(lines)
    pragma = request.headers.get("pragma")
    if pragma is None:
        return None
    return "no-cache" if "no-cache" in {d.strip().lower() for d in pragma.split(",")} else None


GENERATION_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})


def announce_generation(request: Request, engine: EngineClient | None) -> Any:
    """A chat or text completion whose key is valid is announced to the engine here
    (``AsyncEngine.announce``): the idle engine waits for announced requests to finish their
    admission (limits, quota) instead of guessing the end of a burst from gaps between arrivals.
    After the key check, so neither a body still uploading nor a request without a valid key holds
    the engine. The notice goes to ``generate`` (``Caller.notice``); the request context withdraws
    it if the request ends first. None for other routes or an engine that takes no notices."""
    if request.scope["method"] != "POST" or request.scope["path"] not in GENERATION_ROUTES:
        return None
    announce = getattr(engine, "announce", None)
    return announce() if announce is not None else None


async def read_and_admit(request: Request, model: type[M]) -> tuple[M, Caller]:
    """A JSON body parameter and ``authenticate_and_limit``, in FastAPI's order and with its
    answers: the body is read whole and decoded first (a body that is not JSON is refused before
    any rate-limit slot or engine notice is taken; a caller without a valid key learns nothing
    about its body: 401 before 400), then the key and the rate limit, then the value is validated.
    A valid body is parsed and validated in one pass by pydantic's own JSON parser; one it refuses
    is read again as FastAPI reads it (``json.loads``, then validation of the value), so that every
    refusal is the one the app's handlers give FastAPI's routes (pydantic's parser refuses a lone
    surrogate as bad JSON, where the value's validation names the field that holds it)."""
    try:
        body = await request.body()
    except ClientDisconnect:  # gone mid-upload: FastAPI's answer, to nobody
        raise _not_json() from None
    parsed: M | None = None
    value: Any = None  # JSON ``model_validate_json`` refused, read again (a body that is none is refused first)
    content_type = request.headers.get("content-type")
    if body and is_json_content_type(content_type):
        limit = getattr(model, "max_json_objects", None)  # (a chat's: ``ChatCompletionRequest``)
        if limit is not None and holds_too_many_objects(body, limit):
            raise await key_refusal(request) or too_many_objects(limit)
        try:
            parsed = model.model_validate_json(body)
        except ValidationError:
            try:
                value = json.loads(body)
            except Exception as exc:  # not JSON, not UTF-8, nested too deep, an integer too long
                raise await key_refusal(request) or _not_json(exc) from None
    elif (refusal := unread_body(body, content_type)) is not None:
        # no body, or not JSON's content type: refused before the rate limit as bad JSON is (found
        # by QA: these took a request from the window, and the same mistake then read as a 429)
        raise await key_refusal(request) or refusal
    caller = await authenticate_and_limit(request)
    if parsed is not None:
        return parsed, caller
    try:
        return model.model_validate(value), caller
    except ValidationError as exc:
        raise validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def unread_body(body: bytes, content_type: str | None) -> ApiError | None:
    """The refusal of a body that cannot be read as JSON without parsing it: none at all, or one
    sent with a content type that is not JSON's; None for a body to parse."""
    if not body:
        return validation_error([{"type": "missing", "loc": ("body",)}])
    return content_type_refusal(content_type)


async def readable_body(request: Request) -> None:
    """A dependency declared before the caller's (``CallerDep``), for routes FastAPI serves: the
    refusal ``unread_body`` gives comes before the rate limit takes a request (and after the key
    check: 401 before 400), as ``read_and_admit`` gives it on the generation routes."""
    try:
        body = await request.body()
    except ClientDisconnect:
        raise _not_json() from None
    if (refusal := unread_body(body, request.headers.get("content-type"))) is not None:
        raise await key_refusal(request) or refusal


ReadableBodyDep = Annotated[None, Depends(readable_body)]


def _not_json(exc: Exception | None = None) -> ApiError:
    return too_many_digits(exc) or validation_error([{"type": "json_invalid", "loc": ("body",)}])


StateDep = Annotated[AppState, Depends(get_state)]
CallerDep = Annotated[Caller, Depends(authenticate_and_limit)]
