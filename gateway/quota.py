"""Quotas and token-rate limits: ``QuotaLedger`` reserves a request's worst case before it reaches
the engine and reconciles it with the real counts afterwards.

Per tenant and period (UTC day or month) Redis holds a counter of tokens and money (1e-8 USD
units) — a cache of the usage rows in the database: when the counter is missing (new period,
Redis restarted or flushed) it is rebuilt from the period's usage rows before reserving.

``reserve`` charges prompt_tokens + max_tokens (and their price) in one Lua script, so concurrent
requests in any number of processes can never overspend. **Clamping:** ``max_tokens`` is lowered
to the largest completion that still fits the token budget, the money budget (at the model's
completion price) and the tenant's TPM window; only when not even one completion token fits (or
the prompt alone does not) is the request refused — 429 ``insufficient_quota`` for a budget,
429 ``rate_limit_exceeded`` for TPM. The engine then stops at the clamped length
(``finish_reason: "length"``). ``settle`` replaces the reservation by the real counts and is
idempotent. TPM is a sliding-window counter over the current and the previous minute.

Keys (one hash tag per tenant, so the multi-key scripts work on Redis Cluster)::

    <prefix>{t:<id>}:q:<d20261129|m202611>   hash tok, usd, epoch   (period counter)
    <prefix>{t:<id>}:tpm:<minute>            int                     (TPM bucket)
    <prefix>{t:<id>}:res                     hash id -> "tok:usd:tpm:epoch" (open reservations;
                                             "settled" / "stale:<epoch>": markers)
    <prefix>{t:<id>}:resdl                   zset id -> deadline

A reservation its gateway never settles (the process was killed) is refunded in full by the next
reservation of that tenant once its lease lapses: a live process renews its open reservations'
leases (``lease_s``, 60 s) every quarter of it (``renew_leases``). A refunded entry stays as a
``stale:`` marker, so a live process cut off from Redis past its lease is charged its real
amounts when it settles.
(Known gap: a process killed in the ~20 ms between a response and its settlement leaves a usage
row, so that request's real amounts are refunded too and the counter stays short of them until its
next rebuild. Dropping the counter on expiry instead was tried and reverted: the rebuild left out
other processes' open reservations, and a two-gateway QA run spent 2,370 of a 1,500-token budget.)

Losing Redis (flushed, restarted without its data) loses the counter and the open reservations:
the counter is rebuilt from the usage rows, and a request that was running meanwhile, whose row
the rebuild could not see, adds its real amounts when it settles (its reservation carries the
counter's epoch, and the rebuilt counter has another). A tenant without a budget is not refused
while its counter cannot be rebuilt (the database is down too): there is nothing to enforce.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from importlib import resources

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.aftercare import TRANSIENT_REDIS_ERRORS
from gateway.auth import Principal
from gateway.coalesce import Coalescer
from gateway.db.models import UsageRecord
from gateway.errors import ApiError
from gateway.ids import new_hex_id
from gateway.limits import format_reset, store_unavailable
from gateway.log_throttle import LogThrottle
from gateway.pricing import Price, PriceBook, summed_usd, units_to_usd, usd_sum, usd_to_units
from gateway.quota_refusals import quota_refusal, tpm_empty_s, tpm_headers, tpm_refusal
from gateway.redis_lane import ScriptLane

log = logging.getLogger("pagegate.quota")

RESERVATION_TTL_S = 3600  # requests run no longer than this (this process forgets a reservation then)
# an open reservation is refunded once its deadline passes: its process pushes the deadline this far
# ahead every lease_s / 4 while the request runs (``_renew_leases``), so only a dead process's lapse
# (found by QA: a SIGKILLed worker's reservations held a tenant's budget for an hour)
RESERVATION_LEASE_S = 60
REBUILD_RETRY_S = 1.0  # a counter's rebuild that failed (database down) is tried again after this
# one process rebuilds a counter at a time (``lua/quota_rebuild_lock.lua``): its lock outlasts a
# rebuild's slowest path (the journal's flush, the peers' answers and the sum, each on its timeout);
# a process waits for another's rebuild this long before it gives up (503) or, the lock expired
# (its holder died), rebuilds itself
REBUILD_LOCK_S = 30.0
REBUILD_POLL_S = 0.02
CACHE_HITS = ("hit", "semantic-hit")  # usage rows that used no engine tokens: not charged


def _script(name: str) -> str:
    return resources.files("gateway.lua").joinpath(name).read_text()


def period_bounds(period: str, now: datetime) -> tuple[str, datetime, datetime]:
    """(id, start, end) of the UTC ``day`` or ``month`` containing ``now``."""
    now = now.astimezone(UTC)
    if period == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return f"d{start:%Y%m%d}", start, start + timedelta(days=1)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return f"m{start:%Y%m}", start, end


def counter_span_us(key: str) -> tuple[int, int]:
    """[start, end) in unix µs of the period whose counter is ``key`` (``counter_key``'s form)."""
    period_id = key.rsplit(":q:", 1)[1]
    start = datetime.strptime(period_id[1:], "%Y%m%d" if period_id[0] == "d" else "%Y%m").replace(tzinfo=UTC)
    _, start, end = period_bounds("day" if period_id[0] == "d" else "month", start)
    return int(start.timestamp()) * 1_000_000, int(end.timestamp()) * 1_000_000


def counter_key(prefix: str, tenant_id: int, period_id: str) -> str:
    """The Redis key of a tenant's period counter (``period_id`` from ``period_bounds``)."""
    return f"{prefix}{{t:{tenant_id}}}:q:{period_id}"


async def forget_counter(redis: Redis, prefix: str, tenant_id: int, period: str) -> None:
    """Drop the tenant's counter of the current ``period``: the next reservation rebuilds it from the
    usage rows. A tenant's budget period changed to ``period``: that counter, if it exists, was left
    behind while the other period's was charged (month, then day, then month again), and would
    undercount what the tenant spent."""
    period_id, _, _ = period_bounds(period, datetime.now(UTC))
    await redis.delete(counter_key(prefix, tenant_id, period_id))


@dataclass(slots=True)
class Reservation:
    id: str
    tenant_id: int
    model: str
    prompt_tokens: int
    requested_max_tokens: int
    max_tokens: int  # possibly clamped: pass THIS to the engine
    reserved_tokens: int
    price: Price
    headers: dict[str, str] = field(default_factory=dict)  # x-ratelimit-*-tokens
    settled: bool = False
    counter_key: str = ""
    tpm_key: str = ""
    epoch: str = ""  # the period counter's epoch when it was made ("": made without a counter)
    # when it was made, unix µs: the budget period was picked by it, and the request's usage row is
    # dated by it, so the row counts in the period whose counter the request charged
    made_us: int = 0

    @property
    def reserved_usd(self) -> Decimal:
        return self.price.worst_cost(self.prompt_tokens, self.max_tokens)

    @property
    def clamped(self) -> bool:
        return self.max_tokens < self.requested_max_tokens


class QuotaUnavailable(ApiError):
    pass


def rebuild_unavailable() -> QuotaUnavailable:
    """A counter's rebuild that the database cannot serve (fail closed: the period's spend is unknown)."""
    return QuotaUnavailable(503, "Quota state is being rebuilt and the database is unavailable; retry shortly.",
                            "server_error", "quota_unavailable", headers={"retry-after": "1"})


@dataclass(slots=True)
class _Ask:
    """One request's reservation, waiting for its batch."""

    principal: Principal
    model: str
    price: Price
    prompt_tokens: int
    max_tokens: int
    min_tokens: int = 1  # the fewest completion tokens worth admitting (0 when none were asked)
    id: str = ""


class QuotaLedger:
    """``await reserve(principal, model=, prompt_tokens=, max_tokens=)`` → Reservation;
    ``await settle(reservation, prompt_tokens=, completion_tokens=)`` (idempotent; ``settle_soon``:
    the same, submitted at once, its future returned);
    ``await release(reservation)`` = settle with zero (cache hits, failures before the engine)."""

    def __init__(self, redis: Redis, sessionmaker: async_sessionmaker[AsyncSession], prices: PriceBook, *,
                 prefix: str, before_rebuild: Callable[[], Awaitable[int | None]] | None = None,
                 reservation_ttl_s: int = RESERVATION_TTL_S, lease_s: int = RESERVATION_LEASE_S) -> None:
        self._redis = redis
        self._sessionmaker = sessionmaker
        self._prices = prices
        self._prefix = prefix
        # e.g. flush pending usage rows so the DB is complete; it may return how many of this
        # process's rows are surely in the database (``UsageWriter.written``), and ``row_mark`` how
        # many it has recorded (``UsageWriter.recorded``): a request that ends during a rebuild is
        # then charged to the rebuilt counter only if its row is not in the sum
        self._before_rebuild = before_rebuild
        self.row_mark: Callable[[], int] | None = None
        self._deferred: dict[str, int | None] = {}  # reservation id -> rows recorded when it ended
        self._in_sum: set[str] = set()  # deferred past a rebuild whose sum holds their rows
        # where a job that Redis could not take now goes to be tried again (TenancyServices sets
        # its aftercare's retry_later); None: such a job is dropped
        self.retry_later: Callable[[Callable[[], Awaitable[object] | None], str], None] | None = None
        # settles this process's requests that have ended but not yet settled (their settlements
        # wait ``settle_delay_ms`` in the aftercare) and says whether there were any; None: none wait
        self.settle_pending: Callable[[], Awaitable[bool]] | None = None
        self.reservation_ttl_s = reservation_ttl_s
        self.lease_s = lease_s
        self._renewal: asyncio.Task | None = None
        self._renew_log = LogThrottle(60.0)
        self._reserve = redis.register_script(_script("quota_reserve.lua"))
        self._settle = redis.register_script(_script("quota_settle.lua"))
        self._init = redis.register_script(_script("quota_init.lua"))
        self._adopt_script = redis.register_script(_script("quota_adopt.lua"))
        self._lock_script = redis.register_script(_script("quota_rebuild_lock.lua"))
        self._unlock_script = redis.register_script(_script("quota_rebuild_unlock.lua"))
        self._rebuilding_here: set[str] = set()  # counters this process holds the rebuild lock of
        self._lane = ScriptLane.for_client(redis)  # the request path's scripts: one pipelined connection
        self._periods: dict[str, tuple[str, datetime, float]] = {}  # period -> (id, end, end as unix s)
        self._keys: dict[tuple[int, str], tuple[str, str, str, str]] = {}
        self._batches: Coalescer = Coalescer(self._reserve_batch, orphan=self._release_orphan)
        self._orphans: set[asyncio.Task] = set()
        self._settlements: Coalescer = Coalescer(self._settle_batch)
        self._rebuilding: dict[str, asyncio.Task] = {}  # counter key -> its rebuild in flight
        # counter key -> monotonic time before which a rebuild that failed (the database down) is not
        # tried again: the requests meanwhile get the 503 at once (found by QA: each refused request
        # tried the database again, 358 warnings in 18 s, none of them waiting out the backoff)
        self._rebuild_failed: dict[str, float] = {}
        self._rebuild_log = LogThrottle()
        # (tenant id, counter key) -> the other processes charge their open reservations to the
        # counter just rebuilt (``PeerFlush.ask(rebuilt=...)``), waited for before the batch is retried
        self.after_rebuild: Callable[[int, str], Awaitable[object]] | None = None
        # this process's reservations not yet handed to a settlement, and the counters' epochs last
        # seen: a rebuilt counter (a new epoch) gets them back (``_adopt``)
        self._open: dict[str, Reservation] = {}
        self._epochs: dict[str, str] = {}

    def _tag(self, tenant_id: int) -> str:
        return f"{self._prefix}{{t:{tenant_id}}}"

    def counter_key(self, tenant_id: int, period_id: str) -> str:
        return counter_key(self._prefix, tenant_id, period_id)

    def _period(self, period: str, now: float) -> tuple[str, datetime]:
        """(id, end) of the current ``period``, kept until it ends (one datetime per period)."""
        cached = self._periods.get(period)
        if cached is None or now >= cached[2]:
            period_id, _, end = period_bounds(period, datetime.fromtimestamp(now, UTC))
            cached = self._periods[period] = (period_id, end, end.timestamp())
        return cached[0], cached[1]

    def _tenant_keys(self, tenant_id: int, period_id: str) -> tuple[str, str, str, str]:
        """(counter, reservations, deadlines, TPM prefix) of a tenant in a period, memoised."""
        keys = self._keys.get((tenant_id, period_id))
        if keys is None:
            if len(self._keys) > 100_000:  # many tenants or a long uptime: start afresh
                self._keys.clear()
            tag = self._tag(tenant_id)
            keys = self._keys[(tenant_id, period_id)] = (
                counter_key(self._prefix, tenant_id, period_id), f"{tag}:res", f"{tag}:resdl", f"{tag}:tpm:")
        return keys

    async def reserve(self, principal: Principal, *, model: str, prompt_tokens: int, max_tokens: int,
                      min_tokens: int = 1) -> Reservation:
        """``min_tokens``: below this many completion tokens the request is refused rather than
        clamped (``n`` choices need ``n``; an embedding asks for none)."""
        if prompt_tokens < 0 or max_tokens < 0:
            raise ValueError("token counts must be >= 0")
        min_tokens = min(max(1, min_tokens), max_tokens)
        try:
            price = await self._prices.get(model)
        except Exception as exc:  # prices never loaded and the database is unreachable
            raise store_unavailable("price", cause=exc) from exc
        group = (principal.tenant_id, principal.budget_period, principal.budget_tokens, principal.budget_usd,
                 principal.tpm_limit)
        return await self._batches.submit(group, _Ask(principal, model, price, prompt_tokens, max_tokens, min_tokens))

    async def _reserve_batch(self, group: tuple, asks: list[_Ask], *, settled: bool = False
                             ) -> list[Reservation | ApiError]:
        """One script call for the reservations of one tenant made in one event-loop iteration
        (``gateway.coalesce``), taken one after the other: a Reservation or an ApiError for each.
        Those refused while reservations are open are tried once more after this process's ended
        requests have settled (``settle_pending``): a client that sends its next request as soon as
        its answer arrives finds its last reservation still open for ``settle_delay_ms``, and was
        told its budget was held by requests in flight when it had none (found by QA)."""
        principal = asks[0].principal  # the group shares the tenant, its budgets, period and TPM
        budget_usd = group[3]
        now_us = time.time_ns() // 1000  # (exact: the usage rows are dated by it)
        now = now_us / 1e6
        period_id, period_end = self._period(principal.budget_period, now)
        minute, frac = divmod(now / 60.0, 1.0)
        minute = int(minute)
        counter, res_key, deadlines, tpm_prefix = self._tenant_keys(principal.tenant_id, period_id)
        keys = [counter, res_key, deadlines, f"{tpm_prefix}{minute}", f"{tpm_prefix}{minute - 1}"]
        args: list = [
            -1 if principal.budget_tokens is None else int(principal.budget_tokens),
            -1 if budget_usd is None else usd_to_units(budget_usd),
            max(0, principal.tpm_limit), repr(frac), int(now), int(now) + self.lease_s,
            2 * self.reservation_ttl_s + 86400, 0,
        ]
        prices: dict[Price, tuple[str, str]] = {}
        for ask in asks:
            units = prices.get(ask.price)
            if units is None:
                units = prices[ask.price] = tuple(map(repr, ask.price.units_per_token))
            ask.id = new_hex_id()
            args += (ask.prompt_tokens, ask.max_tokens, *units, ask.id, ask.min_tokens)
        try:
            result = await self._lane.run(self._reserve, keys=keys, args=args)
            if result[0] == -1:
                try:
                    await self._rebuild_once(principal.tenant_id, principal.budget_period, keys[0], period_end)
                except QuotaUnavailable:
                    if principal.budget_tokens is not None or budget_usd is not None:
                        raise
                    args[7] = 1  # no budget to enforce: go on without the counter (the next rebuild counts it)
                result = await self._lane.run(self._reserve, keys=keys, args=args)
        except RedisError as exc:
            if isinstance(exc, TRANSIENT_REDIS_ERRORS) and self.retry_later is not None:
                # the script may have run and only its reply been lost: each reservation it may have
                # made is given back once Redis answers (found by QA: it stayed charged for its
                # one-hour TTL, and the tenant was refused meanwhile); one never made is a no-op
                group = (principal.tenant_id, keys[0], keys[3])
                for ask in asks:
                    self.retry_later(partial(self._settlements.submit, group, (ask.id, 0, 0, "")),
                                     f"(release of a reservation whose reply was lost: {ask.id})")
            return [store_unavailable("quota", cause=exc) for _ in asks]
        except QuotaUnavailable as exc:  # the database is down while the counter is rebuilt
            return [dataclasses.replace(exc, headers=dict(exc.headers)) for _ in asks]  # one each
        if result[0] == -1 or len(result) != 1 + 5 * len(asks):
            return [QuotaUnavailable(503, "Quota store is unavailable; retry shortly.", "server_error",
                                     "quota_unavailable") for _ in asks]
        epoch = result[0].decode() if isinstance(result[0], bytes) else str(result[0])
        result = result[1:]
        tpm_limit = principal.tpm_limit
        reset_s = format_reset(tpm_empty_s(0, 1, frac))  # (a request served has just charged this minute)
        out: list[Reservation | ApiError] = []
        held: list[int] = []  # refused while reservations were open
        for i, ask in enumerate(asks):
            code, a, b = int(result[5 * i]), int(result[5 * i + 1]), int(result[5 * i + 2])
            if (code == -2 and (int(result[5 * i + 3]) or int(result[5 * i + 4]))) or (
                    code == -3 and int(result[5 * i + 4])):  # (what open reservations hold, in the reply)
                held.append(i)
            if code == -2:
                out.append(quota_refusal(principal, a, b, ask.prompt_tokens + ask.min_tokens,
                                         ask.price.worst_cost_units(ask.prompt_tokens, ask.min_tokens), period_end,
                                         retry_after_s=max(1.0, period_end.timestamp() - now),
                                         held_tok=int(result[5 * i + 3]), held_units=int(result[5 * i + 4]),
                                         completes=ask.max_tokens > 0))
            elif code == -3:
                out.append(tpm_refusal(tpm_limit, a, int(result[5 * i + 2]), int(result[5 * i + 3]), frac,
                                        ask.prompt_tokens + ask.min_tokens, held=int(result[5 * i + 4]),
                                        completes=ask.max_tokens > 0))
            else:
                headers = tpm_headers(tpm_limit, int(result[5 * i + 4]), reset_s) if tpm_limit > 0 else {}
                reservation = Reservation(
                    id=ask.id, tenant_id=principal.tenant_id, model=ask.model, prompt_tokens=ask.prompt_tokens,
                    requested_max_tokens=ask.max_tokens, max_tokens=a, reserved_tokens=ask.prompt_tokens + a,
                    price=ask.price, counter_key=keys[0], tpm_key=keys[3], headers=headers, epoch=epoch, made_us=now_us)
                self._open[reservation.id] = reservation
                out.append(reservation)
        if len(self._open) > 100_000:  # settlements that never came (a bug): forget what is past its TTL
            self._open = {i: r for i, r in self._open.items() if now_us - r.made_us < self.reservation_ttl_s * 1_000_000}
        if len(self._epochs) > 100_000:  # a counter per tenant and period: start afresh, as _keys does
            self._epochs.clear()
        seen = self._epochs.get(keys[0])
        self._epochs[keys[0]] = epoch
        # rebuilt by another process meanwhile; or a counter this process meets for the first time,
        # which its open reservations of the tenant made inside its period may need to move to (the
        # budget period changed while this process could not hear of the rebuild): both rare
        if epoch and seen != epoch:
            await self._adopt(principal.tenant_id, keys[0], current=epoch, move=True)
        if held and not settled and self.settle_pending is not None and await self.settle_pending():
            again = await self._reserve_batch(group, [asks[i] for i in held], settled=True)
            for i, result_i in zip(held, again, strict=True):
                out[i] = result_i
        return out

    async def _adopt(self, tenant_id: int, key: str, current: str | None = None, *, renewal: bool = False,
                     move: bool = False) -> None:
        """Charge this process's open reservations of counter ``key`` to it again where it was rebuilt
        since they were made, and renew the leases of those in it (``lua/quota_adopt.lua``). Best
        effort: a reservation left out is still charged its real amounts when it settles, as before.
        ``current``: the counter's epoch, when known (its reservations are in it already).
        ``renewal``: a Redis error is raised (the renewal logs it once for all its counters).
        ``move``: ``key`` is the tenant's counter now, just rebuilt; the tenant's open reservations
        of another counter made inside its period move to it, and settle there: the tenant's budget
        period changed while they ran (found by QA: a stream running when a day budget became a month
        one settled on the day's counter, and the month's, rebuilt from the rows, never counted it)."""
        if not self._open:  # (the common case at a counter's first sight: nothing to charge or move)
            return
        mine = [r for r in self._open.values() if r.counter_key == key and r.epoch != current and r.id not in self._in_sum]
        if move:
            start, end = counter_span_us(key)
            mine += [r for r in self._open.values() if r.tenant_id == tenant_id and r.counter_key
                     and r.counter_key != key and start <= r.made_us < end and r.id not in self._in_sum]
        if not mine:
            return
        args: list = [self.lease_s, 2 * self.reservation_ttl_s + 86400]
        for r in mine:
            args += (r.id, r.prompt_tokens, r.max_tokens, *map(repr, r.price.units_per_token))
        tag = self._tag(tenant_id)
        try:
            reply = await self._lane.run(self._adopt_script, keys=[key, f"{tag}:res", f"{tag}:resdl"], args=args)
        except RedisError as exc:
            if not renewal:
                log.warning("quota: open reservations not charged to the rebuilt counter %s: %r", key, exc)
                return
            raise
        epoch = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if epoch:
            self._epochs[key] = epoch
            for r in mine:
                r.epoch, r.counter_key = epoch, key

    def start(self) -> None:
        """Start renewing this process's open reservations' leases (every ``lease_s / 4``)."""
        if self._renewal is None:
            self._renewal = asyncio.ensure_future(self._renew_leases())

    async def aclose(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
            self._renewal = None

    async def _renew_leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 4)
            await self.renew_leases()

    async def renew_leases(self) -> None:
        """Push the deadlines of this process's open reservations ``lease_s`` ahead: one script call
        per tenant counter (``_adopt``, which also charges them again to a counter rebuilt without
        them, or refunded when their lease lapsed while Redis was out of reach). A Redis error is
        logged and the next round tries again."""
        counters = {(r.tenant_id, r.counter_key) for r in list(self._open.values()) if r.counter_key}
        for tenant_id, key in counters:
            try:
                await self._adopt(tenant_id, key, renewal=True)
            except RedisError as exc:
                self._renew_log.log(log, logging.WARNING, "quota: the leases of open reservations were not renewed "
                                    "(Redis: %r); those left %d s without renewal are refunded, and charged again "
                                    "at the next renewal", exc, self.lease_s)
                return
            except Exception:  # noqa: BLE001 - the loop must go on: a lapsed lease only refunds early
                log.exception("quota: renewing the leases of open reservations failed")
                return
        self._renew_log.reset()

    async def adopt_rebuilt(self, tenant_id: int, key: str) -> None:
        """Another process rebuilt counter ``key``: charge this process's open reservations of it
        to it again (those already in it are left alone: ``lua/quota_adopt.lua``), and those of the
        tenant's other counters made inside its period (``_adopt``'s ``move``)."""
        await self._adopt(tenant_id, key, move=True)

    def _release_orphan(self, _group: tuple, _ask: _Ask, reservation: Reservation) -> None:
        """A caller cancelled while its reservation was being made: give it back now."""
        task = asyncio.ensure_future(self.release(reservation))
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)

    async def settle(self, reservation: Reservation, *, prompt_tokens: int, completion_tokens: int,
                     cached_prompt_tokens: int = 0) -> bool:
        """Replace the reservation by the real counts (``cached_prompt_tokens``: the part of the
        prompt's served from the prefix cache, priced at its own rate). Returns True when this call
        settled it, False when it had been settled before (by this or another call)."""
        submitted = self.settle_soon(reservation, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                     cached_prompt_tokens=cached_prompt_tokens)
        return False if submitted is None else await submitted

    def settle_soon(self, reservation: Reservation, *, prompt_tokens: int, completion_tokens: int,
                    cached_prompt_tokens: int = 0) -> asyncio.Future[bool] | None:
        """``settle``, submitted now (with the other settlements of this event-loop iteration):
        the future of its result, or None when it had been settled before. No coroutine, so the
        aftercare settles a wave without a task per request. Await the future (or hand it to the
        aftercare): a failure is raised there and nowhere else."""
        if reservation.settled:
            self._open.pop(reservation.id, None)
            return None
        rebuild = self._rebuilding.get(reservation.counter_key)
        if (rebuild is not None and not rebuild.done() and reservation.counter_key in self._rebuilding_here
                and reservation.id in self._open):
            # its counter is being rebuilt from the usage rows, and this request's row may come too
            # late for that sum (found by QA: settled meanwhile, against no counter, it was in
            # neither, and a flushed Redis with a slow database let the tenant overspend by 5-10%):
            # it stays open until the rebuild charges it again (``_adopt``), then settles the
            # difference; unless its row is in the sum (``UsageWriter.written`` covers it: then it is
            # not charged again, and its settlement only clears its entry, giving its TPM reservation
            # back whole; a row that reached the sum unknown to this process is counted twice until
            # the next rebuild: the safe side). The caller is answered now: the rebuild itself first
            # drains the settlements in hand (``before_rebuild``), and must not wait for this one.
            self._deferred[reservation.id] = self.row_mark() if self.row_mark is not None else None
            rebuild.add_done_callback(partial(self._settle_after_rebuild, reservation, prompt_tokens,
                                              completion_tokens, cached_prompt_tokens))
            answered: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            answered.set_result(True)
            return answered
        self._open.pop(reservation.id, None)  # (its settlement takes care of it from here)
        tokens = max(0, prompt_tokens) + max(0, completion_tokens)
        units = reservation.price.cost_units(max(0, prompt_tokens), max(0, completion_tokens), cached_prompt_tokens)
        done = self._settlements.submit((reservation.tenant_id, reservation.counter_key, reservation.tpm_key),
                                        (reservation.id, tokens, units, reservation.epoch))
        done.add_done_callback(partial(_mark_settled, reservation))
        return done

    def _settle_after_rebuild(self, reservation: Reservation, prompt_tokens: int, completion_tokens: int,
                              cached_prompt_tokens: int, _rebuild: asyncio.Future) -> None:
        self._open.pop(reservation.id, None)
        self._deferred.pop(reservation.id, None)
        if reservation.id in self._in_sum:  # its row is in the rebuilt counter: only clean its entry up
            self._in_sum.discard(reservation.id)
            prompt_tokens = completion_tokens = cached_prompt_tokens = 0
        submitted = self.settle_soon(reservation, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                     cached_prompt_tokens=cached_prompt_tokens)
        if submitted is not None:
            submitted.add_done_callback(partial(self._deferred_settled, reservation, prompt_tokens, completion_tokens,
                                                cached_prompt_tokens))

    def _deferred_settled(self, reservation: Reservation, prompt_tokens: int, completion_tokens: int,
                          cached_prompt_tokens: int, done: asyncio.Future) -> None:
        """A settlement deferred past a rebuild has no caller waiting for it: a failure is retried
        here (Redis down: as the aftercare retries its own), or logged."""
        if done.cancelled() or done.exception() is None:
            return
        exc = done.exception()
        if isinstance(exc, TRANSIENT_REDIS_ERRORS) and self.retry_later is not None:
            self.retry_later(partial(self.settle_soon, reservation, prompt_tokens=prompt_tokens,
                                     completion_tokens=completion_tokens, cached_prompt_tokens=cached_prompt_tokens),
                             f"(settlement of {reservation.id}, deferred past a counter rebuild)")
        else:
            log.error("quota: settlement of %s failed after a counter rebuild: %r", reservation.id, exc)

    async def _settle_batch(self, group: tuple[int, str, str], items: list[tuple[str, int, int, str]]) -> list[bool]:
        """One script call for the settlements of one tenant, counter and TPM bucket made in one
        event-loop iteration (``gateway.coalesce``)."""
        tenant_id, counter_key, tpm_key = group
        tag = self._tag(tenant_id)
        args = [value for item in items for value in item]
        done = await self._lane.run(self._settle, keys=[f"{tag}:res", f"{tag}:resdl", counter_key, tpm_key],
                                    args=args)
        return [bool(d) for d in done]

    async def release(self, reservation: Reservation) -> bool:
        """Give the whole reservation back (nothing was generated or it was a cache hit)."""
        return await self.settle(reservation, prompt_tokens=0, completion_tokens=0)

    async def open_reservations(self, tenant_id: int) -> int:
        """How many reservations of the tenant are not settled yet (not the markers of settled or
        lapsed ones)."""
        values = await self._redis.hvals(f"{self._tag(tenant_id)}:res")
        return sum(1 for v in values if v[:1].isdigit() or v[:1] == b"-")

    async def usage(self, tenant_id: int, period: str = "month") -> tuple[int, Decimal] | None:
        """(tokens, usd) charged in the current period per Redis (incl. open reservations), or None
        when the counter is not in Redis."""
        period_id, _, _ = period_bounds(period, datetime.now(UTC))
        tok, usd = await self._redis.hmget(self.counter_key(tenant_id, period_id), "tok", "usd")
        if tok is None:
            return None
        return int(tok), units_to_usd(int(usd or 0))

    async def forget(self, tenant_id: int, period: str = "month") -> None:
        """Drop the period counter; the next reservation rebuilds it from the database."""
        await forget_counter(self._redis, self._prefix, tenant_id, period)

    def _rebuild_once(self, tenant_id: int, period: str, key: str, period_end: datetime) -> asyncio.Future:
        """The counter's rebuild, shared by every batch that finds it missing meanwhile (a new
        period, or Redis flushed: each would otherwise flush the usage rows and query the database)."""
        task = self._rebuilding.get(key)
        if task is None and time.monotonic() < self._rebuild_failed.get(key, 0.0):
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(rebuild_unavailable())
            return failed
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = self._rebuilding[key] = asyncio.ensure_future(self._rebuild(tenant_id, period, key, period_end))
            task.add_done_callback(lambda t: self._rebuilding.pop(key, None) if self._rebuilding.get(key) is t else None)
        return asyncio.shield(task)

    async def _rebuild(self, tenant_id: int, period: str, key: str, period_end: datetime) -> None:
        try:
            await self._rebuild_now(tenant_id, period, key, period_end)
        except QuotaUnavailable as exc:
            self._rebuild_failed[key] = time.monotonic() + REBUILD_RETRY_S
            cause = exc.__cause__
            self._rebuild_log.log(log, logging.WARNING, "quota: the budget counter of tenant %s cannot be rebuilt "
                                  "(%s); its requests get 503 quota_unavailable until the database answers",
                                  tenant_id, "its usage rows cannot be written" if cause is None
                                  else f"{type(cause).__name__}: {cause}")  # (QA: it was never logged)
            raise
        self._rebuild_failed.pop(key, None)

    async def _rebuild_now(self, tenant_id: int, period: str, key: str, period_end: datetime) -> None:
        lock, token = f"{key}:rebuild", new_hex_id()
        if not await self._take_rebuild(key, lock, token):  # another process rebuilt it meanwhile
            await self._adopt(tenant_id, key)  # (as its ask would have: before the batch is retried)
            return
        self._rebuilding_here.add(key)  # (what ends from here waits for the new counter: ``settle_soon``)
        try:
            await self._rebuild_locked(tenant_id, period, key, period_end)
        finally:
            self._rebuilding_here.discard(key)
            try:
                await self._lane.run(self._unlock_script, keys=[lock], args=[token])
            except RedisError:  # (it expires)
                pass

    async def _take_rebuild(self, key: str, lock: str, token: str) -> bool:
        """True once this process holds the rebuild lock of counter ``key``; False when another
        process has rebuilt the counter meanwhile (waited for, up to ``REBUILD_LOCK_S``)."""
        deadline = time.monotonic() + REBUILD_LOCK_S
        while True:
            state = await self._lane.run(self._lock_script, keys=[key, lock],
                                         args=[token, int(REBUILD_LOCK_S * 1000)])
            state = state.decode() if isinstance(state, bytes) else str(state)
            if state != "wait":
                return state == "mine"
            if time.monotonic() >= deadline:
                raise rebuild_unavailable()
            await asyncio.sleep(REBUILD_POLL_S)

    async def _rebuild_locked(self, tenant_id: int, period: str, key: str, period_end: datetime) -> None:
        written = None
        if self._before_rebuild is not None:
            written = await self._before_rebuild()  # (settles what ended before: their rows are in the sum)
        # the period of the counter being rebuilt, not of now (found by a review: a rebuild of day D's
        # counter still writing rows past midnight summed D+1's)
        _, start, end = period_bounds(period, period_end - timedelta(microseconds=1))
        try:
            tokens, usd = await period_usage_from_db(self._sessionmaker, tenant_id, start, end)
        except Exception as exc:  # fail closed: without the DB the period's spend is unknown
            raise rebuild_unavailable() from exc
        ttl = int(period_end.timestamp() - time.time()) + 2 * 86400
        made = await self._init(keys=[key], args=[tokens, usd_to_units(usd), ttl, uuid.uuid4().hex])
        if written is not None and made:  # ended meanwhile with their rows in the sum: not charged again
            # (not made: another process's counter, from another sum; only if this one's lock expired)
            self._in_sum |= {rid for rid, seen in self._deferred.items() if seen is not None and seen <= written}
        await self._adopt(tenant_id, key, move=True)  # before the batch that found it missing is retried
        if self.after_rebuild is not None:  # the other processes' open reservations too (QA: 2,370 of 1,500)
            await self.after_rebuild(tenant_id, key)


def _mark_settled(reservation: Reservation, done: asyncio.Future) -> None:
    if not done.cancelled() and done.exception() is None:
        reservation.settled = True


async def period_usage(session: AsyncSession, tenant_id: int, start: datetime, end: datetime) -> tuple[int, Decimal]:
    """Tokens (engine-served rows only) and exact cost of a tenant's usage rows in [start, end): what
    its budget counts as spent (the counter's rebuild, and the admin's view of the budget)."""
    dialect = (await session.connection()).dialect.name
    charged = case((UsageRecord.cache.in_(CACHE_HITS), 0),
                   else_=UsageRecord.prompt_tokens + UsageRecord.completion_tokens)
    stmt = select(func.coalesce(func.sum(charged), 0), usd_sum(UsageRecord.cost_usd, dialect)).where(
        and_(UsageRecord.tenant_id == tenant_id, UsageRecord.created_at >= start, UsageRecord.created_at < end))
    tokens, usd = (await session.execute(stmt)).one()
    return int(tokens or 0), summed_usd(usd, dialect)


async def period_usage_from_db(sessionmaker: async_sessionmaker[AsyncSession], tenant_id: int,
                               start: datetime, end: datetime) -> tuple[int, Decimal]:
    """``period_usage`` in a session of its own."""
    async with sessionmaker() as session:
        return await period_usage(session, tenant_id, start, end)
