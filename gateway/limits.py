"""Request-rate limits (RPM) per API key and per tenant, shared by every gateway process.

Two layers limit request rates: slowapi's ``Limiter`` per client address, before authentication
(``gateway.ip_limit``), then this one, per key and per tenant, after it. slowapi keys limits by
route and a key function with static limit strings, and its check is synchronous, so per-key
and per-tenant limits (read per request from the caller's ``Principal``, taken from both windows
all or nothing) are done here as the moving windows of slowapi's rate-limiting engine, the
``limits`` package (its list layout: request timestamps, newest first, trimmed to the limit),
taken and read for both windows in one async Lua round trip (``lua/rate_window.lua``, on the
request path's pipelined script connection, ``gateway.redis_lane``) where ``limits`` needs four.

Redis keys: ``<prefix>rl:LIMITER/{t:<tenant>}/k/<key id>/minute`` and
``<prefix>rl:LIMITER/{t:<tenant>}/t/minute``: one hash tag per tenant, so the one script that
takes a request from both windows (all or nothing) works on Redis Cluster. Unlike ``limits``' own
keys they do not hold the limit, so a changed limit applies to the same window: lowered, it
refuses until fewer requests than the new limit were taken in the last minute; raised, the room
is there at once. (A key holding the limit started an empty window on every change: a tenant
lowered from 5 to 4 a minute could make 9 requests in that minute, a QA find.)"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from importlib import resources

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.auth import Principal
from gateway.coalesce import Coalescer
from gateway.errors import ApiError, rate_limited
from gateway.log_throttle import LogThrottle
from gateway.redis_lane import ScriptLane

log = logging.getLogger("pagegate.limits")


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


_STORE_LOGS: dict[str, LogThrottle] = {}


def store_unavailable(what: str, *, cause: BaseException | None = None) -> ApiError:
    """503 when Redis cannot be reached: limits and quotas fail closed, never open. (``cause``:
    the Redis error, for the logs, when the error is handed over rather than raised ``from`` it.)
    The cause is logged, one line per 10 s per store (found by QA: Redis out of memory refused 318
    requests in 14 s and the log said nothing)."""
    err = ApiError(503, f"The {what} store is unavailable; retry shortly.", "server_error",
                   "store_unavailable", headers={"retry-after": "1"})
    err.__cause__ = cause
    if cause is not None:
        throttle = _STORE_LOGS.get(what)
        if throttle is None:
            throttle = _STORE_LOGS[what] = LogThrottle()
        throttle.log(log, logging.WARNING, "%s store unavailable, requests refused with 503: %s: %s", what,
                     type(cause).__name__, cause)
    return err


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

    def __init__(self, redis: Redis, *, prefix: str) -> None:
        self.key_prefix = f"{prefix}rl"
        self._redis = redis
        self._window = redis.register_script(resources.files("gateway.lua").joinpath("rate_window.lua").read_text())
        self._lane = ScriptLane.for_client(redis)
        self._plans: dict[tuple[int, int, int, int], tuple[list, list[str], list[int]]] = {}
        self._batches: Coalescer = Coalescer(self._take)

    async def check_request(self, principal: Principal) -> dict[str, str]:
        plan_key = (principal.tenant_id, principal.key_id, principal.rpm_limit, principal.tenant_rpm)
        plan = self._plans.get(plan_key)
        if plan is None:
            plan = self._plan(plan_key, principal)
        if not plan[0]:
            return {}
        allowed, headers, refusal = await self._batches.submit(plan_key, plan)
        if not allowed:
            raise rate_limited(refusal[0], retry_after_s=refusal[1], headers=headers)
        return headers

    async def _take(self, plan_key: tuple, plans: list[tuple[list, list[str], list[int]]]) -> list:
        """One script call for the requests of one key made in one event-loop iteration
        (``gateway.coalesce``): (allowed, headers, (message, retry after) | None) for each."""
        windows, keys, limits = plans[0]
        n = len(plans)
        now = time.time()
        try:
            reply = await self._lane.run(self._window, keys=keys, args=[repr(now), self.WINDOW_S, n, *limits])
        except RedisError as exc:
            return [store_unavailable("rate-limit", cause=exc) for _ in plans]
        taken = int(reply[0])
        before = [int(reply[1 + 2 * i]) for i in range(len(windows))]
        resets = [max(0.0, float(reply[2 + 2 * i]) + self.WINDOW_S - now) for i in range(len(windows))]
        return self._admitted(windows, before, resets, taken) + [
            self._outcome(windows, before, resets, i, taken) for i in range(taken, n)]

    @staticmethod
    def _admitted(windows: list, before: list[int], resets: list[float], taken: int) -> list:
        """``_outcome`` of the first ``taken`` requests of a batch (all admitted), computed once:
        each takes one more request from every window, so the window with the least room left is
        the same for all of them (the first of equals, as ``min`` picks) and only the count moves."""
        if taken <= 0:
            return []
        room = [limit - count0 for (_, _, limit), count0 in zip(windows, before, strict=True)]
        w = room.index(min(room))
        limit, left, reset = str(windows[w][2]), room[w], format_reset(resets[w])
        return [(True, {"x-ratelimit-limit-requests": limit, "x-ratelimit-remaining-requests": str(left - i),
                        "x-ratelimit-reset-requests": reset}, None) for i in range(1, taken + 1)]

    @staticmethod
    def _outcome(windows: list, before: list[int], resets: list[float], i: int, taken: int) -> tuple:
        """The i-th request of a batch of which the first ``taken`` got in."""
        allowed = i < taken
        checks = []
        for (scope, _, limit), count0, reset_s in zip(windows, before, resets, strict=True):
            count = count0 + (i + 1 if allowed else taken)
            checks.append(_Check(scope, limit, allowed or count < limit, max(0, limit - count), reset_s))
        refused = [c for c in checks if not c.allowed]
        binding = max(refused, key=lambda c: c.reset_s) if refused else min(checks, key=lambda c: c.remaining)
        headers = {
            "x-ratelimit-limit-requests": str(binding.limit),
            "x-ratelimit-remaining-requests": str(binding.remaining),
            "x-ratelimit-reset-requests": format_reset(binding.reset_s),
        }
        if allowed:
            return True, headers, None
        return False, headers, (
            f"Rate limit reached for requests: limit {binding.limit} per minute for this {binding.scope}. "
            f"Please try again in {format_reset(binding.reset_s)}.", max(binding.reset_s, 0.001))

    def _plan(self, plan_key: tuple, principal: Principal) -> tuple[list, list[str], list[int]]:
        """(windows with a limit, their Redis keys, their limits) of a key, memoised per key and limits."""
        windows = [w for w in self._windows(principal) if w[2] > 0]
        keys = [self.window_key(ids) for _, ids, _limit in windows]
        if len(self._plans) > 100_000:
            self._plans.clear()
        plan = self._plans[plan_key] = (windows, keys, [w[2] for w in windows])
        return plan

    def window_key(self, ids: tuple[str, ...]) -> str:
        """The Redis key of a window (``ids``: as ``_windows`` gives them)."""
        return f"{self.key_prefix}:LIMITER/{'/'.join(ids)}/minute"

    @staticmethod
    def _windows(p: Principal) -> list[tuple[str, tuple[str, ...], int]]:
        """(scope, limits identifiers, limit) of the key's and the tenant's windows; the tenant's
        hash tag leads the identifiers so both windows live in one Redis Cluster slot. A key whose
        limit is not below its tenant's (the tenant's, inherited) has no window of its own: the
        tenant's counts all its keys' requests, so it always binds first (and a refusal names it)."""
        tag = f"{{t:{p.tenant_id}}}"
        key_rpm = 0 if 0 < p.tenant_rpm <= p.rpm_limit else p.rpm_limit
        return [("API key", (tag, "k", str(p.key_id)), key_rpm),
                ("organization", (tag, "t"), p.tenant_rpm)]

    async def reset(self, principal: Principal) -> None:
        """Forget both windows (admin action / tests)."""
        await self._redis.delete(*(self.window_key(ids) for _, ids, _limit in self._windows(principal)))
