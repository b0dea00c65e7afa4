"""The bookkeeping of one API request: settle its quota reservation and record its usage row,
exactly once, however the request ended (finished, refused by the engine, client disconnected).
Call ``close`` from a ``finally``; it never raises and never waits on the database. With the
services' ``aftercare`` (``gateway.aftercare``, ``settle_delay_ms`` > 0) the settling and the row
run a few milliseconds later, off the response's path; the row keeps the latency and time
measured at ``close``."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

log = logging.getLogger("pagegate.accounting")


class RequestAccount:
    def __init__(self, services: Any, principal: Any, *, request_id: str, model: str, endpoint: str,
                 started: float) -> None:
        self._services = services
        self.principal = principal
        self.request_id = request_id
        self.model = model
        self.endpoint = endpoint
        self.started = started  # time.perf_counter() at arrival
        self.reservation: Any = None
        self.cache = "miss"  # hit | semantic-hit | miss | bypass
        self._closed = False

    async def reserve(self, *, prompt_tokens: int, max_tokens: int) -> int:
        """Reserve quota; returns the (possibly clamped) max_tokens. Raises ApiError 429."""
        self.reservation = await self._services.quota.reserve(
            self.principal, model=self.model, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        return int(self.reservation.max_tokens)

    @property
    def headers(self) -> dict[str, str]:
        return dict(getattr(self.reservation, "headers", None) or {})

    async def close(self, *, status: str, finish_reason: str | None = None, prompt_tokens: int = 0,
                    cached_prompt_tokens: int = 0, completion_tokens: int = 0, ttft_ms: float | None = None,
                    cache_hit: bool = False) -> None:
        """Settle and record. On a cache hit nothing is charged; the usage row keeps the tokens the
        stored answer cost and the money it saved."""
        if self._closed:
            return
        self._closed = True
        latency_ms = (time.perf_counter() - self.started) * 1000
        created_at = datetime.now(UTC)
        aftercare = getattr(self._services, "aftercare", None)
        args = (status, finish_reason, prompt_tokens, cached_prompt_tokens, completion_tokens, ttft_ms, cache_hit,
                latency_ms, created_at)
        if aftercare is None or aftercare.inline:
            await self._settle_and_record(*args)
        else:
            aftercare.submit(lambda: self._settle_and_record(*args))

    async def _settle_and_record(self, status: str, finish_reason: str | None, prompt_tokens: int,
                                 cached_prompt_tokens: int, completion_tokens: int, ttft_ms: float | None,
                                 cache_hit: bool, latency_ms: float, created_at: datetime) -> None:
        services = self._services
        if self.reservation is not None:
            try:
                await services.quota.settle(self.reservation, prompt_tokens=prompt_tokens,
                                            completion_tokens=completion_tokens)
            except Exception:
                log.exception("quota settle failed for %s", self.request_id)
        cost = saved = Decimal(0)
        try:
            value = await services.prices.cost(self.model, prompt_tokens, completion_tokens)
            if cache_hit:
                saved = value
            else:
                cost = value
        except Exception:
            log.exception("pricing failed for %s", self.request_id)
        try:
            from gateway.usage import UsageEvent

            services.usage.record(UsageEvent(
                request_id=self.request_id,
                created_at=created_at,
                tenant_id=self.principal.tenant_id,
                api_key_id=self.principal.key_id,
                model=self.model,
                endpoint=self.endpoint,
                prompt_tokens=prompt_tokens,
                cached_prompt_tokens=cached_prompt_tokens,
                completion_tokens=completion_tokens,
                cost_usd=cost,
                saved_usd=saved,
                latency_ms=latency_ms,
                ttft_ms=ttft_ms,
                status=status,
                finish_reason=finish_reason,
                cache=self.cache,
            ))
        except Exception:
            log.exception("usage record failed for %s", self.request_id)
