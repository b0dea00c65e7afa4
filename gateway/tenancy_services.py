"""Everything tenancy the gateway needs per process, built once at start-up and closed at exit:

    services = await build_tenancy(settings, redis_url=url)   # url: PAGEGATE_REDIS_URL or EmbeddedRedis
    principal = await services.auth.authenticate(request.headers.get("authorization"),
                                                 query_string=request.scope.get("query_string", b""))
    headers = await services.limiter.check_request(principal)            # 429 rate_limit_exceeded
    res = await services.quota.reserve(principal, model=m, prompt_tokens=p, max_tokens=n)  # 429s
    ... generate with res.max_tokens (may be clamped) ...
    await services.quota.settle(res, prompt_tokens=p, completion_tokens=c)   # always, also on abort
    services.usage.record(UsageEvent(...cost_usd=await services.prices.cost(m, p, c)...))
    (the app does these last two through gateway.accounting; the settlement deferred by services.aftercare)
    await services.close()
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from redis.asyncio import BlockingConnectionPool, Redis

from gateway.aftercare import Aftercare
from gateway.auth import Authenticator
from gateway.db.session import Database
from gateway.limits import RequestLimiter
from gateway.metrics import RequestMetrics
from gateway.peer_flush import PeerFlush
from gateway.pricing import PriceBook
from gateway.quota import QuotaLedger, rebuild_unavailable
from gateway.redis_lane import ScriptLane
from gateway.settings import Settings
from gateway.usage import UsageWriter

log = logging.getLogger("pagegate.gateway")

REDIS_MAX_CONNECTIONS = 512
# how long a counter's rebuild waits for the other processes to write their usage rows, and a
# refusal while reservations are open for them to settle their ended requests
PEER_FLUSH_TIMEOUT_S = 2.0
PEER_SETTLE_TIMEOUT_S = 0.5


@dataclass(slots=True)
class TenancyServices:
    settings: Settings
    db: Database
    redis: Redis
    auth: Authenticator
    limiter: RequestLimiter
    quota: QuotaLedger
    usage: UsageWriter
    prices: PriceBook
    redis_url: str = ""
    aftercare: Aftercare | None = None  # requests' quota settlements, run after their responses
    peers: PeerFlush | None = None  # the other processes on this Redis, asked to settle and flush
    metrics: RequestMetrics | None = None  # request counters for GET /metrics (gateway.metrics)

    async def close(self) -> None:
        """Run the deferred settlements, drain the usage writer (rows not written stay spooled),
        stop listeners, close clients."""
        if self.aftercare is not None:
            with contextlib.suppress(Exception):
                await self.aftercare.drain()
            if self.aftercare.retrying:  # Redis still unreachable: said, not silently dropped (found by QA)
                # (a timed-out script may still have run once Redis woke: then it is settled after all,
                # which the log cannot know; a QA run found every such counter exact)
                log.error("%d quota settlements were not confirmed before the stop (Redis unreachable): any that "
                          "did not run have their reservations refunded whole within about a minute, and those requests' "
                          "tokens count against their budgets only from the counters' next rebuild",
                          self.aftercare.retrying)
        with contextlib.suppress(Exception):
            await self.quota.aclose()
        if self.peers is not None:
            with contextlib.suppress(Exception):
                await self.peers.close()
        if self.metrics is not None:
            with contextlib.suppress(Exception):
                await self.metrics.aclose()
        with contextlib.suppress(Exception):
            await self.usage.close()
        with contextlib.suppress(Exception):
            await self.auth.close()
        with contextlib.suppress(Exception):
            await self.prices.aclose()
        with contextlib.suppress(Exception):
            await ScriptLane.for_client(self.redis).aclose()
        with contextlib.suppress(Exception):
            await self.redis.aclose()
        with contextlib.suppress(Exception):
            await self.redis.connection_pool.disconnect()
        with contextlib.suppress(Exception):
            await self.db.dispose()


async def build_tenancy(settings: Settings, *, redis_url: str, upgrade_schema: bool = False,
                        database: Database | None = None) -> TenancyServices:
    """Connect to the database and Redis and start the background tasks (auth invalidation
    listener, usage writer). ``upgrade_schema=True`` runs ``alembic upgrade head`` first (what
    ``pagegate serve`` does); otherwise call ``await services.db.upgrade()`` yourself."""
    db = database or Database(settings.database_url, timeout_s=settings.database_timeout_s)
    if upgrade_schema:
        await db.upgrade()
    # A blocking pool: a burst beyond max_connections waits for a free connection instead of failing.
    # socket_timeout: a Redis that stops answering fails calls (503) instead of hanging them; the
    # request path's pipelined connection (ScriptLane) takes the same timeout
    pool = BlockingConnectionPool.from_url(redis_url, max_connections=REDIS_MAX_CONNECTIONS, timeout=10,
                                           health_check_interval=30, socket_timeout=settings.redis_timeout_s,
                                           socket_connect_timeout=settings.redis_timeout_s)
    redis = Redis(connection_pool=pool)
    await redis.ping()
    prices = PriceBook(db.sessionmaker)
    usage = UsageWriter(db.url, settings.usage_spool_dir, flush_interval_s=settings.usage_flush_interval_s,
                        batch_size=settings.usage_batch_size, db_interval_s=settings.usage_db_interval_s,
                        db_timeout_s=settings.database_timeout_s)
    auth = Authenticator(db.sessionmaker, redis, settings)
    limiter = RequestLimiter(redis, prefix=settings.redis_prefix)

    aftercare = Aftercare(settings.settle_delay_ms / 1000)

    async def bookkeeping(usage_rows: bool) -> None:
        """This process's: settlements of requests that just ended, and (``usage_rows``) the usage
        rows still in its journal written to the database."""
        await aftercare.drain()
        if usage_rows:
            with contextlib.suppress(Exception):  # DB down: the rebuild sees what reached the DB
                await usage.flush()

    peers = PeerFlush(redis, settings.redis_prefix, bookkeeping)

    async def flush_usage() -> int:  # before a period counter is rebuilt from the database
        await aftercare.drain()
        try:
            flushed = await usage.flush(retry_db=False)
        except Exception:  # noqa: BLE001 - the database refused or timed out: as below
            flushed = False
        if not flushed:
            # this process's rows could not reach the database: its sum would miss them (an
            # undercount), and the query would wait out the same timeout again (found by QA: with
            # PostgreSQL hung, the flush, the peers' and the query took 10-12 s before the 503)
            raise rebuild_unavailable()
        await peers.ask(usage=True, timeout_s=PEER_FLUSH_TIMEOUT_S)
        return usage.written_anywhere()  # this process's rows in the sum about to be read (another's flush too)

    quota = QuotaLedger(redis, db.sessionmaker, prices, prefix=settings.redis_prefix, before_rebuild=flush_usage)
    quota.retry_later = aftercare.retry_later
    quota.row_mark = lambda: usage.recorded
    peers.on_rebuilt = quota.adopt_rebuilt

    async def rebuilt(tenant_id: int, key: str) -> None:
        await peers.ask(usage=False, timeout_s=PEER_SETTLE_TIMEOUT_S, rebuilt=(tenant_id, key))

    quota.after_rebuild = rebuilt

    async def settle_pending() -> bool:  # before a refusal while reservations are open
        had = bool(aftercare.pending)
        if had:
            await aftercare.drain()
        return await peers.ask(usage=False, timeout_s=PEER_SETTLE_TIMEOUT_S) > 0 or had

    quota.settle_pending = settle_pending
    services = TenancyServices(settings=settings, db=db, redis=redis, auth=auth, limiter=limiter, quota=quota,
                               usage=usage, prices=prices, redis_url=redis_url, aftercare=aftercare, peers=peers,
                               metrics=RequestMetrics(settings.metrics_dir, settings.worker_index))
    try:
        services.metrics.start()
        await usage.start()
        await auth.start()
        await peers.start()
        prices.start()
        quota.start()
    except BaseException:
        await services.close()
        raise
    return services
