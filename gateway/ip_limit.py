"""Per-client-IP request-rate limit on ``/v1/*``, checked before authentication: slowapi.

A flood of requests from one address (guessed keys, a runaway script) is refused with 429
``rate_limit_exceeded`` before it costs a key lookup in the database. The limit is declared with
slowapi's own ``Limiter`` (an application-wide limit of ``settings.ip_rpm`` per minute keyed by
the client address, moving window, Redis storage shared by every gateway process;
``app.state.limiter``).

slowapi's own check is synchronous (blocking Redis calls through ``limits``' sync storage), so
running it on the event loop would block the loop, and running it on a thread pool costs a
thread hop and GIL hand-offs per request. slowapi's rate-limiting engine, the ``limits`` package,
has an asyncio storage with the same Lua scripts and the same key layout, so the gateway
evaluates slowapi's declared application limits (their ``RateLimitItem``, key function and
scope: what ``Limiter._check_request_limit`` evaluates in a middleware) with ``limits``'
asyncio moving-window strategy on the gateway's shared async Redis connection pool; the hit
itself (``limits``' own ``acquire_moving_window`` script, key and arguments) goes over the
request path's pipelined script connection (``gateway.redis_lane``). The window in Redis is the
very one slowapi's synchronous check reads and writes (``tests/gateway/test_ip_limit.py``
checks that both see each other's hits).

Per-key and per-tenant request limits stay in ``gateway.limits`` (one atomic async Lua script for
both windows, limits read per request from the tenant's settings), which slowapi cannot express.

Redis keys: ``<prefix>rl:LIMITER/ip/<client address>/global/<rpm>/1/minute``. Behind a reverse
proxy the client address is the proxy's unless uvicorn is told to trust ``X-Forwarded-For``
(``--proxy-headers --forwarded-allow-ips``)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import warnings

from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redis.asyncio import Redis
from starlette.requests import Request
from starlette.types import Scope

from gateway.coalesce import Coalescer
from gateway.errors import rate_limited
from gateway.limits import format_reset, storage_uri, store_unavailable
from gateway.log_throttle import LogThrottle
from gateway.redis_lane import ScriptLane

log = logging.getLogger(__name__)


def client_address(request: Request) -> str:
    """slowapi key function: the peer address uvicorn saw (after its proxy-header handling)."""
    return request.client.host if request.client else "unknown"


class ClientIPLimiter:
    """``await check(request)``: one request from the client's per-minute window, or ApiError
    429 (``retry-after``) / 503 when Redis is unreachable (fail closed like every limit).

    ``redis``: the gateway's async client, whose connection pool the check shares; without it the
    limiter opens its own pool from ``redis_url`` (close it with ``await aclose()``)."""

    def __init__(self, redis_url: str, *, prefix: str, rpm: int, redis: Redis | None = None) -> None:
        from slowapi import Limiter

        if rpm < 1:
            raise ValueError("rpm must be >= 1 (0 means: do not build a limiter)")
        self.rpm = rpm
        with warnings.catch_warnings():  # settings come from Settings: no config file is read
            warnings.simplefilter("ignore")
            self.limiter = Limiter(
                key_func=client_address, application_limits=[f"{rpm}/minute"],
                storage_uri=storage_uri(redis_url, asyncio_client=False),
                storage_options={"key_prefix": f"{prefix}rl"}, strategy="moving-window", key_prefix="ip",
                key_style="url", headers_enabled=False, swallow_errors=False, in_memory_fallback_enabled=False,
                config_filename=os.devnull)
        # slowapi's declared application limits, as its middleware check evaluates them
        self._limits = list(itertools.chain(*self.limiter._application_limits))
        for lim in self._limits:
            if lim.methods or lim.per_method or lim.exempt_when or callable(lim.cost):
                raise ValueError("only plain application limits are evaluated asynchronously")
        # (item, key function, limits identifiers after the address, cost): slowapi's own arguments
        self._checks = [(lim.limit, lim.key_func, lim.scope, lim.cost) for lim in self._limits]
        self._own_redis = redis is None
        self._redis = redis if redis is not None else Redis.from_url(redis_url)
        self._storage = RedisStorage(storage_uri(redis_url), implementation="redispy", key_prefix=f"{prefix}rl",
                                     connection_pool=self._redis.connection_pool)
        self._strategy = MovingWindowRateLimiter(self._storage)
        # The hot path: `limits`' own moving-window script and key (what `hit` runs through
        # redis-py), sent on the gateway's pipelined script connection; `hit` when absent.
        bridge = getattr(self._storage, "bridge", None)
        self._acquire = getattr(bridge, "lua_acquire_moving_window", None)
        self._lane = ScriptLane.for_client(self._redis)
        self._by_address = all(key_func is client_address for _, key_func, _, _ in self._checks)
        self._plans: dict[str, list[tuple]] = {}  # client address -> its hits (``_plan``), memoised
        self._batches: Coalescer = Coalescer(self._hit_batch)
        self._unavailable = LogThrottle()  # one warning per outage, not one per refused request

    async def check(self, request: Request) -> None:
        await self.check_scope(request.scope, request)

    async def check_scope(self, scope: Scope, request: Request | None = None) -> None:
        """``check`` from the ASGI scope: with slowapi's address key function (the only one
        ``gateway`` declares) the hits' Redis keys are found by the address alone, memoised, and
        no ``Request`` is built."""
        if self._by_address:
            client = scope.get("client")
            address = client[0] if client else "unknown"
            plan = self._plans.get(address)
            if plan is None:
                plan = self._plan(address, request or Request(scope))
        else:
            plan = self._plan(None, request or Request(scope))
        for item, args, group, cost in plan:
            try:
                if group is None:  # no pipelined script: `limits`' own hit
                    if await self._strategy.hit(item, *args, cost=cost):
                        continue
                elif await self._batches.submit(group, cost):
                    continue
                stats = await self._strategy.get_window_stats(item, *args)
                reset_s = max(0.001, stats.reset_time - time.time())
            except Exception as exc:  # Redis unreachable
                inner = exc.__cause__ or exc.__context__  # (a wrapped Redis error: its own text, found by QA)
                self._unavailable.log(log, logging.WARNING, "ip limit: storage unavailable: %s: %s%s",
                                      type(exc).__name__, exc, f" ({type(inner).__name__}: {inner})" if inner else "")
                raise store_unavailable("rate-limit") from exc
            limit = item.amount
            raise rate_limited(
                f"Too many requests from your address: limit {limit} per minute. "
                f"Please try again in {format_reset(reset_s)}.", retry_after_s=reset_s,
                headers={"x-ratelimit-limit-requests": str(limit), "x-ratelimit-remaining-requests": "0",
                         "x-ratelimit-reset-requests": format_reset(reset_s)})

    def _plan(self, address: str | None, request: Request) -> list[tuple]:
        """Per declared limit: (item, slowapi's limits identifiers, the batch group (Redis key,
        amount, expiry) of ``MovingWindowRateLimiter.hit``'s script — the same script, key and
        arguments as `limits`' redis-py storage (``acquire_entry``), sent on the pipelined
        connection — or None without that script, cost). Memoised per address when ``address``."""
        plan = []
        for item, key_func, scope, cost in self._checks:
            args = (self.limiter._key_prefix, key_func(request), scope)
            group = None
            if self._acquire is not None:
                group = (self._storage.bridge.prefixed_key(item.key_for(*args)), item.amount, item.get_expiry())
            plan.append((item, args, group, cost))
        if address is not None:
            if len(self._plans) > 100_000:  # many addresses: start afresh
                self._plans.clear()
            self._plans[address] = plan
        return plan

    async def _hit_batch(self, group: tuple[str, int, int], costs: list[int]) -> list[bool]:
        """All the hits at once (``limits``' script takes an amount, all or nothing); when the
        window has no room for all of them, one after the other, in order, as separate hits."""
        key, amount, expiry = group
        now = time.time()
        if len(costs) > 1 and await self._lane.run(self._acquire, keys=[key], args=[now, amount, expiry, sum(costs)]):
            return [True] * len(costs)
        replies = await asyncio.gather(*(self._lane.run(self._acquire, keys=[key], args=[now, amount, expiry, c])
                                         for c in costs))
        return [bool(r) for r in replies]

    async def aclose(self) -> None:
        """Close the connection pool (and its script connection) when it is the limiter's own."""
        if self._own_redis:
            await self._lane.aclose()
            await self._redis.aclose()
            await self._redis.connection_pool.disconnect()

