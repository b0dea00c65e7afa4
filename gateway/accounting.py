"""The bookkeeping of one API request: settle its quota reservation and record its usage row,
exactly once, however the request ended (finished, refused by the engine, client disconnected).
Call ``close`` from a ``finally``; it never raises and never waits on the database. The usage
row is journaled at once (durable before the response leaves); with the services' ``aftercare``
(``gateway.aftercare``, ``settle_delay_ms`` > 0) the quota settlement runs ~20 ms later, batched,
off the response's path."""

from __future__ import annotations

import logging
import time
from decimal import Decimal
from typing import Any

from gateway.aftercare import TRANSIENT_REDIS_ERRORS, to_the_end
from gateway.log_throttle import LogThrottle
from gateway.usage import UsageEvent

log = logging.getLogger("pagegate.accounting")
_SETTLE_DOWN = LogThrottle()  # Redis down: one line per 10 s, not one per request


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
        self.price: Any = None  # the price the reservation was made at: the row and the settlement use it
        # when the reservation was made (unix µs): the row is dated by it, so that a request running
        # across the end of a budget period counts in the period whose counter it charged (found by
        # QA: dated by its end, a stream from 23:59:50 to 00:00:20 charged day D and was reported in D+1)
        self.admitted_us: int | None = None
        self.cache = "bypass"  # hit | semantic-hit | miss (looked up) | bypass (not looked up: the chat route sets it)
        self._closed = False

    async def reserve(self, *, prompt_tokens: int, max_tokens: int, min_tokens: int = 1) -> int:
        """Reserve quota; returns the (possibly clamped) max_tokens, never below ``min_tokens``.
        Raises ApiError 429."""
        self.reservation = await self._services.quota.reserve(
            self.principal, model=self.model, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
            min_tokens=min_tokens)
        self.price = self.reservation.price
        self.admitted_us = getattr(self.reservation, "made_us", None) or None
        return int(self.reservation.max_tokens)

    @property
    def headers(self) -> dict[str, str]:
        return dict(getattr(self.reservation, "headers", None) or {})

    @property
    def closes_now(self) -> bool:
        """``close_now`` may be used: nothing of the bookkeeping waits (the prices are loaded, the
        settlement goes to the aftercare). Then nothing can interrupt it either: a task is only
        cancelled where it waits, so ``close_now`` needs no shield from cancellation (~6-15 µs
        an ``anyio.CancelScope``)."""
        if self._closed:
            return True
        aftercare = getattr(self._services, "aftercare", None)
        settles_later = self.reservation is None or (aftercare is not None and not aftercare.inline)
        return settles_later and self._services.prices.loaded

    async def close(self, *, status: str, finish_reason: str | None = None, prompt_tokens: int = 0,
                    cached_prompt_tokens: int = 0, completion_tokens: int = 0, ttft_ms: float | None = None,
                    cache_hit: bool = False) -> None:
        """Settle and record. On a cache hit nothing is charged; the usage row keeps the tokens the
        stored answer cost and the money it saved."""
        if self._closed:
            return
        self._closed = True
        services = self._services
        aftercare = getattr(services, "aftercare", None)
        if self.reservation is not None and (aftercare is None or aftercare.inline):
            reservation, self.reservation = self.reservation, None
            await self._settle(reservation, prompt_tokens, completion_tokens, cached_prompt_tokens)
        if not services.prices.loaded:
            try:
                await services.prices.get(self.model)
            except Exception:  # recorded at no cost
                log.exception("pricing failed for %s", self.request_id)
        self._finish(status=status, finish_reason=finish_reason, prompt_tokens=prompt_tokens,
                     cached_prompt_tokens=cached_prompt_tokens, completion_tokens=completion_tokens,
                     ttft_ms=ttft_ms, cache_hit=cache_hit)

    async def close_surely(self, **outcome: Any) -> None:
        """``close`` that a cancellation cannot stop half-way (``to_the_end``), at no cost when
        nothing in it waits (``close_now``)."""
        if self.closes_now:
            self.close_now(**outcome)
        else:
            await to_the_end(self.close(**outcome))

    def close_now(self, *, status: str, finish_reason: str | None = None, prompt_tokens: int = 0,
                  cached_prompt_tokens: int = 0, completion_tokens: int = 0, ttft_ms: float | None = None,
                  cache_hit: bool = False) -> None:
        """``close`` without waiting for anything; only when ``closes_now``."""
        if self._closed:
            return
        self._closed = True
        self._finish(status=status, finish_reason=finish_reason, prompt_tokens=prompt_tokens,
                     cached_prompt_tokens=cached_prompt_tokens, completion_tokens=completion_tokens,
                     ttft_ms=ttft_ms, cache_hit=cache_hit)

    def _finish(self, *, status: str, finish_reason: str | None, prompt_tokens: int, cached_prompt_tokens: int,
                completion_tokens: int, ttft_ms: float | None, cache_hit: bool) -> None:
        """The settlement handed to the aftercare (unless done already) and the usage row."""
        reservation = self.reservation
        if reservation is not None:
            quota = self._services.quota  # submitted when the aftercare's batch runs: no task per request
            self._services.aftercare.submit(lambda: quota.settle_soon(reservation, prompt_tokens=prompt_tokens,
                                                                      completion_tokens=completion_tokens,
                                                                      cached_prompt_tokens=cached_prompt_tokens),
                                            f"(quota settlement of {self.request_id})")
        value: Decimal | None = None
        if self.price is not None:  # as the settlement counts it: the budget and the bill agree
            try:
                value = self.price.cost(prompt_tokens, completion_tokens, cached_prompt_tokens)
            except Exception:
                log.exception("pricing failed for %s", self.request_id)
        elif self._services.prices.loaded:
            try:
                value = self._services.prices.cost_now(self.model, prompt_tokens, completion_tokens,
                                                       cached_prompt_tokens)
            except Exception:
                log.exception("pricing failed for %s", self.request_id)
        self._record(value, status=status, finish_reason=finish_reason, prompt_tokens=prompt_tokens,
                     cached_prompt_tokens=cached_prompt_tokens, completion_tokens=completion_tokens,
                     ttft_ms=ttft_ms, cache_hit=cache_hit)

    def _record(self, value: Decimal | None, *, status: str, finish_reason: str | None, prompt_tokens: int,
                cached_prompt_tokens: int, completion_tokens: int, ttft_ms: float | None, cache_hit: bool) -> None:
        """The usage row; ``value``: the request's price (None: pricing failed, recorded as 0)."""
        cost = saved = Decimal(0)
        if value is not None:
            if cache_hit:
                saved = value
            else:
                cost = value
        metrics = getattr(self._services, "metrics", None)
        if metrics is not None:
            try:
                metrics.observe(endpoint=self.endpoint, model=self.model, tenant=self.principal.tenant_id, status=status,
                                cache=self.cache, prompt_tokens=prompt_tokens, cached_prompt_tokens=cached_prompt_tokens,
                                completion_tokens=completion_tokens, cost_usd=float(cost), saved_usd=float(saved),
                                latency_s=time.perf_counter() - self.started,
                                ttft_s=None if ttft_ms is None else ttft_ms / 1000)
            except Exception:
                log.exception("metrics failed for %s", self.request_id)
        try:
            self._services.usage.record(UsageEvent(
                request_id=self.request_id,
                tenant_id=self.principal.tenant_id,
                api_key_id=self.principal.key_id,
                model=self.model,
                endpoint=self.endpoint,
                prompt_tokens=prompt_tokens,
                cached_prompt_tokens=cached_prompt_tokens,
                completion_tokens=completion_tokens,
                cost_usd=cost,
                saved_usd=saved,
                latency_ms=(time.perf_counter() - self.started) * 1000,
                ttft_ms=ttft_ms,
                status=status,
                finish_reason=finish_reason,
                cache=self.cache,
                created_us=self.admitted_us,
            ))
        except Exception:
            log.exception("usage record failed for %s", self.request_id)

    async def _settle(self, reservation: Any, prompt_tokens: int, completion_tokens: int,
                      cached_prompt_tokens: int) -> None:
        quota = self._services.quota
        counts = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "cached_prompt_tokens": cached_prompt_tokens}
        try:
            await quota.settle(reservation, **counts)
        except TRANSIENT_REDIS_ERRORS as exc:  # tried again later: never dropped
            _SETTLE_DOWN.log(log, logging.ERROR, "quota settle failed for %s: %s: %s (retried later)",
                             self.request_id, type(exc).__name__, exc)
            self._services.aftercare.retry_later(
                lambda: quota.settle_soon(reservation, **counts), f"(quota settlement of {self.request_id})")
        except Exception:
            log.exception("quota settle failed for %s", self.request_id)
