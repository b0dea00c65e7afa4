"""Model prices (USD per 1M prompt / completion tokens) from the ``model_prices`` table, cached in
process for a few seconds so the request path rarely reads the database."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal

from sqlalchemy import ColumnElement, Integer, cast, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.db.models import ModelPrice

MILLION = Decimal(1_000_000)
USD_QUANTUM = Decimal("0.00000001")  # the MONEY column's scale
UNITS_PER_1M_USD = Decimal(100)  # 1e-8 USD units per token for a price of 1 USD per 1M tokens
UNITS_PER_USD = Decimal(100_000_000)  # the MONEY column's scale: the quota ledger counts 1e-8 USD


def usd_to_units(usd: Decimal) -> int:
    return int((Decimal(usd) * UNITS_PER_USD).to_integral_value())


def units_to_usd(units: int) -> Decimal:
    return Decimal(units) / UNITS_PER_USD


def usd_sum(column: ColumnElement, dialect: str) -> ColumnElement:
    """``SUM(column)`` of a MONEY column, exact on both databases (0 over no rows); read its value
    with ``summed_usd``. PostgreSQL adds NUMERIC exactly. SQLite keeps NUMERIC as a 64-bit float and
    its SUM adds floats, whose error grows with the rows (630,000 rows gave 2482.56999999 for
    2482.57), so there each row is rounded to its integer 1e-8 USD units and those are added."""
    if dialect == "sqlite":
        return func.coalesce(func.sum(cast(func.round(column * int(UNITS_PER_USD)), Integer)), 0)
    return func.coalesce(func.sum(column), 0)


def summed_usd(value: object, dialect: str) -> Decimal:
    """The exact USD of a ``usd_sum`` read from ``dialect``."""
    if dialect == "sqlite":
        return units_to_usd(int(value or 0))
    return Decimal(str(value or 0))


@dataclass(frozen=True, slots=True)
class Price:
    prompt_usd_per_1m: Decimal
    completion_usd_per_1m: Decimal
    # prompt tokens served from the prefix cache (``cached_prompt_tokens``, a part of the prompt's):
    # None bills them as other prompt tokens
    cached_prompt_usd_per_1m: Decimal | None = None
    # the prices in integer 1e-8 USD per 1M tokens (prompt, completion, cached prompt), when they are
    # exactly that (the table's scale) and not negative: ``cost`` then adds integers instead of
    # Decimals (~1.6x as fast, the same value)
    _units_e8: tuple[int, int, int] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        scaled = [price.scaleb(8) for price in (self.prompt_usd_per_1m, self.completion_usd_per_1m,
                                                self.cached_rate)]
        if all(v.is_finite() and v >= 0 and v == v.to_integral_value() for v in scaled):
            object.__setattr__(self, "_units_e8", (int(scaled[0]), int(scaled[1]), int(scaled[2])))

    @property
    def cached_rate(self) -> Decimal:
        """USD per 1M cached prompt tokens: their own price, or the prompt's."""
        return self.prompt_usd_per_1m if self.cached_prompt_usd_per_1m is None else self.cached_prompt_usd_per_1m

    @property
    def units_per_token(self) -> tuple[float, float]:
        """(prompt, completion) price in 1e-8 USD units per token, as the quota scripts take it: a
        reservation counts every prompt token at the higher of the prompt's and the cached prompt's
        price (which are cached is known only after; found by QA: at the prompt's price, a cached
        price set above it let concurrent requests spend 4.9x a budget)."""
        units = _UNITS.get(self)
        if units is None:
            if len(_UNITS) > 10_000:
                _UNITS.clear()
            units = _UNITS[self] = (float(max(self.prompt_usd_per_1m, self.cached_rate) * UNITS_PER_1M_USD),
                                    float(self.completion_usd_per_1m * UNITS_PER_1M_USD))
        return units

    def worst_cost(self, prompt_tokens: int, completion_tokens: int) -> Decimal:
        """The most ``cost`` can be for these counts, whichever prompt tokens turn out cached (what a
        reservation holds)."""
        return self.cost(prompt_tokens, completion_tokens, self._worst_cached(prompt_tokens))

    def worst_cost_units(self, prompt_tokens: int, completion_tokens: int) -> int:
        return self.cost_units(prompt_tokens, completion_tokens, self._worst_cached(prompt_tokens))

    def _worst_cached(self, prompt_tokens: int) -> int:
        return prompt_tokens if self.cached_rate > self.prompt_usd_per_1m else 0

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> Decimal:
        """USD, rounded half up to the MONEY column's 8 decimals. ``cached_prompt_tokens`` are the
        part of ``prompt_tokens`` served from the prefix cache, at ``cached_rate``."""
        cached = min(max(0, cached_prompt_tokens), max(0, prompt_tokens))
        units = self._integer_units(prompt_tokens, completion_tokens, cached)
        if units is not None:
            return Decimal(units).scaleb(-8)
        raw = (self.prompt_usd_per_1m * (prompt_tokens - cached) + self.cached_rate * cached
               + self.completion_usd_per_1m * completion_tokens) / MILLION
        return raw.quantize(USD_QUANTUM, rounding=ROUND_HALF_UP)

    def cost_units(self, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> int:
        """``cost`` in integer 1e-8 USD units (what the quota ledger counts), without a Decimal when
        the prices allow."""
        cached = min(max(0, cached_prompt_tokens), max(0, prompt_tokens))
        units = self._integer_units(prompt_tokens, completion_tokens, cached)
        return units if units is not None else usd_to_units(self.cost(prompt_tokens, completion_tokens, cached))

    def _integer_units(self, prompt_tokens: int, completion_tokens: int, cached: int) -> int | None:
        """The cost in 1e-8 USD units, rounded half up, by integer arithmetic; None when the prices
        or counts need the Decimal formula."""
        units = self._units_e8
        if units is None or prompt_tokens < 0 or completion_tokens < 0:
            return None
        return (units[0] * (int(prompt_tokens) - cached) + units[2] * cached + units[1] * int(completion_tokens)
                + 500_000) // 1_000_000


_UNITS: dict[Price, tuple[float, float]] = {}  # Price.units_per_token, computed once per price

FREE = Price(Decimal(0), Decimal(0))


class PriceBook:
    """``await prices.cost(model, prompt, completion)`` → Decimal USD (8 decimals), 0 without a price.
    The whole table is reloaded at most every ``ttl_s`` seconds (one query, shared by waiters).
    Only the first load (and one after ``invalidate``) is waited for; later ones run in the
    background while requests go on with the prices they have. After ``start()`` it is re-read
    every ``ttl_s`` whether requests come or not, so an idle process's next request (a batch,
    perhaps) does not get a price changed minutes ago."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], *, ttl_s: float = 5.0) -> None:
        self._sessionmaker = sessionmaker
        self._ttl_s = ttl_s
        self._prices: dict[str, Price] = {}
        self._loaded_at = -1e18
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task | None = None
        self._ticker: asyncio.Task | None = None

    def start(self) -> None:
        """Re-read the table every ``ttl_s`` in the background until ``aclose``."""
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick(), name="price-refresh")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_s)
            with contextlib.suppress(Exception):  # no table yet, or the DB away: the next tick retries
                # (skipped when a request's refresh read it within half the interval; a timer that
                # fires a little early must not skip a whole interval)
                await self._reload(max_age_s=self._ttl_s / 2)

    async def get(self, model: str) -> Price:
        if self._loaded_at < 0:  # never loaded, or invalidated: wait for the table
            await self._reload()
        return self.get_now(model)

    @property
    def loaded(self) -> bool:
        """``get_now`` and ``cost_now`` may be used: the table has been read (and not invalidated)."""
        return self._loaded_at >= 0

    def get_now(self, model: str) -> Price:
        """The price as last read; a table older than ``ttl_s`` is re-read in the background."""
        if time.monotonic() - self._loaded_at > self._ttl_s and (self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.ensure_future(self._reload())
        return self._prices.get(model, FREE)

    def cost_now(self, model: str, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> Decimal:
        """``cost`` without waiting: only once ``loaded``."""
        return self.get_now(model).cost(prompt_tokens, completion_tokens, cached_prompt_tokens)

    async def aclose(self) -> None:
        for task in (self._ticker, self._refresh):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._ticker = None

    async def cost(self, model: str, prompt_tokens: int, completion_tokens: int,
                   cached_prompt_tokens: int = 0) -> Decimal:
        return (await self.get(model)).cost(prompt_tokens, completion_tokens, cached_prompt_tokens)

    def invalidate(self) -> None:
        """Drop the cache (after ``set_price`` in this process)."""
        self._loaded_at = -1e18

    async def _reload(self, *, max_age_s: float | None = None) -> None:
        async with self._lock:
            if time.monotonic() - self._loaded_at <= (self._ttl_s if max_age_s is None else max_age_s):
                return  # another waiter reloaded
            try:
                async with self._sessionmaker() as session:
                    rows = (await session.execute(select(ModelPrice))).scalars().all()
            except Exception:
                if self._loaded_at < 0:
                    raise
                self._loaded_at = time.monotonic() - self._ttl_s / 2  # DB hiccup: keep old prices a bit
                return
            self._prices = {r.model: Price(Decimal(r.prompt_usd_per_1m), Decimal(r.completion_usd_per_1m),
                                           None if r.cached_prompt_usd_per_1m is None
                                           else Decimal(r.cached_prompt_usd_per_1m))
                            for r in rows}
            self._loaded_at = time.monotonic()
