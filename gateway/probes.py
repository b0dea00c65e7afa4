"""The state of what the gateway depends on, for ``/health`` and ``/metrics``: Redis by a write of
a probe key (bounded, shared by concurrent callers, its outcome reused for a second; a write, not a
PING: a Redis out of memory or turned read-only answers PING while it refuses every request's
script, found by a faults QA) and the database as the
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
import logging
import time
from typing import Any

PING_TIMEOUT_S = 1.0  # a Redis that does not answer the probe in this long is reported unavailable
PROBE_TTL_MS = 60_000  # the probe key goes by itself
REUSE_S = 1.0  # health checks every few milliseconds cost Redis one PING a second
# a check waits this long for a fresh PING, then answers with the last outcome (found by QA: with
# Redis hung, every probe took the PING's whole second, past a load balancer's 1 s timeout)
ANSWER_WITHIN_S = 0.25

log = logging.getLogger("pagegate.gateway")


def describe_error(exc: BaseException, *, timeout_s: float | None = None) -> str:
    """An error in one line for an operator: the driver's own message when SQLAlchemy wraps one;
    a bare timeout says how long was waited (found by QA: "TimeoutError" alone)."""
    inner = getattr(exc, "orig", None) or exc
    while type(inner).__name__ == "Error" and inner.__cause__ is not None:  # SQLAlchemy's adapter's own
        inner = inner.__cause__  # wrapper (a re-check: "Error: database ... does not exist"): the driver's
    text = " ".join(str(inner).split())[:300]
    if not text and isinstance(inner, TimeoutError) and timeout_s is not None:
        text = f"no answer within {timeout_s:g} s"
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__


class Outage:
    """A dependency as its users last found it: down from a failed call until one succeeds (the
    usage writer's inserts, the key lookups), with the error and since when (wall clock)."""

    __slots__ = ("error", "since")

    def __init__(self) -> None:
        self.error: str | None = None
        self.since: float | None = None

    def failed(self, exc: BaseException, *, timeout_s: float | None = None) -> None:
        self.error = describe_error(exc, timeout_s=timeout_s)
        if self.since is None:
            self.since = time.time()

    def reached(self) -> float | None:
        """A call succeeded: clears it; how long it was down, or None when it was not."""
        since, self.since, self.error = self.since, None, None
        return None if since is None else time.time() - since

    def state(self) -> dict:
        since = self.since
        return {"status": "ok" if since is None else "unavailable", "error": self.error if since is not None else None,
                "unavailable_for_s": None if since is None else round(max(0.0, time.time() - since), 3)}


def database_state(services: Any) -> dict | None:
    """The database as this process last found it: the usage writer's state
    (``UsageWriter.database_state``), made ``unavailable`` also while the key lookups fail (found
    by QA: requests with an uncached key got 503 ``auth_unavailable`` while the gauge said the
    database was up, as no usage row was waiting). None without a usage writer. No I/O."""
    usage = getattr(services, "usage", None)
    if not hasattr(usage, "database_state"):
        return None
    state = usage.database_state()
    lookups = getattr(getattr(services, "auth", None), "db_outage", None)
    if state["status"] == "ok" and lookups is not None and lookups.since is not None:
        state.update(lookups.state())
    return state


class DependencyProbe:
    def __init__(self, services: Any) -> None:
        self._services = services
        self._redis: dict | None = None
        self._redis_at = -float("inf")
        self._inflight: asyncio.Task | None = None
        prefix = getattr(getattr(services, "settings", None), "redis_prefix", "pg:")
        self._probe_key = f"{prefix}health"  # written by the probe: a Redis that takes no write is down

    async def check(self) -> dict:
        """``{"redis": {"status", "error"}, "database": database_state(services)}``; a part is
        absent when this process has no such service (an app built without tenancy, in tests)."""
        out: dict = {}
        if getattr(self._services, "redis", None) is not None:
            out["redis"] = await self.redis()
        database = database_state(self._services)
        if database is not None:
            out["database"] = database
        return out

    async def redis(self) -> dict:
        if self._redis is not None and time.monotonic() - self._redis_at < REUSE_S:
            return self._redis
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._ping())
        task = self._inflight
        # shielded: a caller that goes away (a disconnected health check) leaves the PING to the others
        if self._redis is None:  # the first check waits for its PING (at most PING_TIMEOUT_S)
            return await asyncio.shield(task)
        done, _ = await asyncio.wait([task], timeout=ANSWER_WITHIN_S)
        return task.result() if done else self._redis  # a hung Redis: the next check finds it out

    async def _ping(self) -> dict:
        try:
            await asyncio.wait_for(self._services.redis.set(self._probe_key, b"1", px=PROBE_TTL_MS), PING_TIMEOUT_S)
            result = {"status": "ok", "error": None}
        except TimeoutError:
            result = {"status": "unavailable", "error": f"no answer to the health probe within {PING_TIMEOUT_S:g} s"}
        except Exception as exc:  # noqa: BLE001 - refused, reset, out of memory, auth: all "unavailable"
            result = {"status": "unavailable", "error": describe_error(exc)}
        before = self._redis
        if before is not None and before["status"] != result["status"]:  # (QA: no line said it was back)
            if result["status"] == "ok":
                log.warning("redis: reachable again (the health probe's write answered)")
            else:
                log.warning("redis: unavailable (%s)", result["error"])
        self._redis, self._redis_at, self._inflight = result, time.monotonic(), None
        return result

    async def aclose(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

