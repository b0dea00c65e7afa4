"""Request-rate limits (RPM) per API key and per tenant, shared by every gateway process.

Built on slowapi's rate-limiting engine, the ``limits`` package, with Redis storage: slowapi's
own ``Limiter`` is synchronous (its Redis calls would block the event loop) and keys limits by
route, so the gateway keeps ``limits``' moving windows (exact; same keys and list layout as its
asyncio ``MovingWindowRateLimiter``) with limits read per request from the caller's
``Principal``, and takes + reads each window in one Lua round trip (``lua/rate_window.lua``)
where ``limits`` needs two. Key and tenant windows are checked concurrently: one round trip of
latency per request. ``slowapi_limiter()`` returns a slowapi ``Limiter`` on the same Redis storage
and key prefix for static per-route limits.

Redis keys: ``<prefix>rl:LIMITER/{k|t}/<id>/<amount>/1/minute`` (single-key Lua ops, so Redis
Cluster is fine). Changing a limit starts a fresh window (the amount is part of the key)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from importlib import resources

from limits import RateLimitItemPerMinute
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.auth import Principal
from gateway.errors import ApiError, rate_limited


def format_reset(seconds: float) -> str:
    """OpenAI-style durations for ``x-ratelimit-reset-*``: ``"250ms"``, ``"12s"``, ``"1m5s"``."""
    if seconds < 1:
        return f"{max(0, int(seconds * 1000))}ms"
    s = math.ceil(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60}s"


def storage_uri(redis_url: str, *, asyncio_client: bool = True) -> str:
    """The ``limits`` storage URI for a redis-py URL (``redis://``, ``rediss://``, ``unix://``)."""
    uri = redis_url
    if uri.startswith("unix://"):
        uri = "redis+unix://" + uri[len("unix://"):]
    return ("async+" + uri) if asyncio_client else uri


def store_unavailable(what: str) -> ApiError:
    """503 when Redis cannot be reached: limits and quotas fail closed, never open."""
    return ApiError(503, f"The {what} store is unavailable; retry shortly.", "server_error",
                    "store_unavailable", headers={"retry-after": "1"})


@dataclass(slots=True)
class _Check:
    scope: str  # "API key" | "organization"
    limit: int
    allowed: bool
    remaining: int
    reset_s: float


class RequestLimiter:
    """``await check_request(principal)`` consumes one request from the key's and the tenant's
    per-minute windows and returns the ``x-ratelimit-*-requests`` headers (of the tighter one), or
    raises ApiError 429 ``rate_limit_exceeded`` with ``retry-after``/``retry-after-ms``.
    A limit of 0 means unlimited (then no headers for it)."""

    WINDOW_S = 60

    def __init__(self, redis: Redis, redis_url: str, *, prefix: str) -> None:
        self.key_prefix = f"{prefix}rl"
        self._storage = RedisStorage(storage_uri(redis_url), implementation="redispy",
                                     key_prefix=self.key_prefix, connection_pool=redis.connection_pool)
        self._strategy = MovingWindowRateLimiter(self._storage)
        self._window = redis.register_script(resources.files("gateway.lua").joinpath("rate_window.lua").read_text())

    async def check_request(self, principal: Principal) -> dict[str, str]:
        wanted = [("k", principal.key_id, principal.rpm_limit), ("t", principal.tenant_id, principal.tenant_rpm)]
        try:
            checks = await asyncio.gather(*(self._hit(kind, ident, limit)
                                            for kind, ident, limit in wanted if limit > 0))
        except RedisError as exc:
            raise store_unavailable("rate-limit") from exc
        if not checks:
            return {}
        refused = [c for c in checks if not c.allowed]
        binding = max(refused, key=lambda c: c.reset_s) if refused else min(checks, key=lambda c: c.remaining)
        headers = {
            "x-ratelimit-limit-requests": str(binding.limit),
            "x-ratelimit-remaining-requests": str(binding.remaining),
            "x-ratelimit-reset-requests": format_reset(binding.reset_s),
        }
        if refused:
            raise rate_limited(
                f"Rate limit reached for requests: limit {binding.limit} per minute for this {binding.scope}. "
                f"Please try again in {format_reset(binding.reset_s)}.",
                retry_after_s=max(binding.reset_s, 0.001), headers=headers)
        return headers

    async def _hit(self, kind: str, ident: int, limit: int) -> _Check:
        key = f"{self.key_prefix}:{RateLimitItemPerMinute(limit).key_for(kind, str(ident))}"
        now = time.time()
        allowed, count, oldest = await self._window(keys=[key], args=[repr(now), limit, self.WINDOW_S])
        scope = "API key" if kind == "k" else "organization"
        reset_s = float(oldest) + self.WINDOW_S - now
        return _Check(scope, limit, bool(allowed), max(0, limit - int(count)), max(0.0, reset_s))

    async def reset(self, principal: Principal) -> None:
        """Forget both windows (admin action / tests)."""
        for kind, ident, limit in (("k", principal.key_id, principal.rpm_limit),
                                   ("t", principal.tenant_id, principal.tenant_rpm)):
            if limit > 0:
                await self._strategy.clear(RateLimitItemPerMinute(limit), kind, str(ident))


def slowapi_limiter(redis_url: str, *, prefix: str, key_func=None):  # noqa: ANN001, ANN201
    """A slowapi ``Limiter`` on the same Redis storage (sync client; for static route limits such
    as ``@limiter.limit("10/minute")`` on admin login). Key defaults to the client address."""
    from slowapi import Limiter
    from slowapi.util import get_remote_address

    return Limiter(key_func=key_func or get_remote_address, storage_uri=storage_uri(redis_url, asyncio_client=False),
                   strategy="moving-window", key_prefix=f"{prefix}rl", headers_enabled=False,
                   config_filename="/dev/null")
