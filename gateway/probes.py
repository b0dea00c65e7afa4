"""The state of what the gateway depends on, for ``/health`` and ``/metrics``: Redis by a PING
(bounded, shared by concurrent callers, its outcome reused for a second) and the database as the
usage writer last found it (``UsageWriter.database_state``: no query of its own, so a health check
never adds load to a database in trouble).

    probe = DependencyProbe(services)       # services: gateway.tenancy_services.TenancyServices
    state = await probe.check()             # {"redis": {...}, "database": {...}}

Neither turns ``/health`` into a 503: both are shared by every gateway process, so a load balancer
that took processes out for them would take them all out at once; ``/health`` says ``degraded``
instead (found by QA: nothing told an operator that Redis or the database was down)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

PING_TIMEOUT_S = 1.0  # a Redis that does not answer a PING in this long is reported unavailable
REUSE_S = 1.0  # health checks every few milliseconds cost Redis one PING a second


class DependencyProbe:
    def __init__(self, services: Any) -> None:
        self._services = services
        self._redis: dict | None = None
        self._redis_at = -float("inf")
        self._inflight: asyncio.Task | None = None

    async def check(self) -> dict:
        """``{"redis": {"status", "error"}, "database": UsageWriter.database_state()}``; a part is
        absent when this process has no such service (an app built without tenancy, in tests)."""
        out: dict = {}
        if getattr(self._services, "redis", None) is not None:
            out["redis"] = await self.redis()
        usage = getattr(self._services, "usage", None)
        if usage is not None and hasattr(usage, "database_state"):
            out["database"] = usage.database_state()
        return out

    async def redis(self) -> dict:
        if self._redis is not None and time.monotonic() - self._redis_at < REUSE_S:
            return self._redis
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._ping())
        task = self._inflight
        # shielded: a caller that goes away (a disconnected health check) leaves the PING to the others
        return await asyncio.shield(task)

    async def _ping(self) -> dict:
        try:
            await asyncio.wait_for(self._services.redis.ping(), PING_TIMEOUT_S)
            result = {"status": "ok", "error": None}
        except TimeoutError:
            result = {"status": "unavailable", "error": f"no answer to PING within {PING_TIMEOUT_S:g} s"}
        except Exception as exc:  # noqa: BLE001 - refused, reset, out of memory, auth: all "unavailable"
            text = " ".join(str(exc).split())[:300]
            result = {"status": "unavailable", "error": f"{type(exc).__name__}: {text}" if text
                      else type(exc).__name__}
        self._redis, self._redis_at, self._inflight = result, time.monotonic(), None
        return result

    async def aclose(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
