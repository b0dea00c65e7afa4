"""API-key authentication: ``Authorization: Bearer pg-…`` → ``Principal`` (the tenant and its
limits, resolved against the settings' defaults).

Principals are cached in process for ``settings.key_cache_ttl_s``. A revoked key or a disabled
tenant must be refused by every gateway process within a second, so the cache is invalidated
through Redis: ``publish_invalidation`` bumps ``<prefix>auth:version`` and publishes on
``<prefix>auth:invalidate:db<N>`` (N: the Redis database number). Each process listens on the
channel (immediate) and, as a fallback when a message is lost, re-reads the version at most every
``version_poll_s`` (200 ms); a changed version drops the whole cache. Loads that raced an
invalidation are not cached.

No request waits for a periodic refresh: the version is re-read in the background (the request
that finds it due starts the read and goes on), and a principal past its TTL is served while one
background load replaces it (invalidations still drop it at once). A key not in the cache is
loaded once however many requests ask for it at the same moment."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from decimal import Decimal

from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.db.models import ApiKey, Tenant
from gateway.errors import ApiError, invalid_api_key, permission_denied
from gateway.keys import hash_key, looks_like_key
from gateway.log_throttle import LogThrottle
from gateway.probes import Outage
from gateway.pubsub import listen_forever
from gateway.settings import Settings
from gateway.tenancy import (
    cache_namespace,
    invalidation_channel,
    invalidation_version_key,
    publish_invalidation,
)

log = logging.getLogger(__name__)
_REFRESH_FAILED = LogThrottle()
_LOOKUP_FAILED = LogThrottle()


@dataclass(slots=True)
class Principal:
    """Who is calling, with every per-tenant setting already resolved (no None for limits:
    0 means unlimited)."""

    tenant_id: int
    tenant_name: str
    key_id: int
    key_prefix: str
    key_hash: str
    allowed_models: list[str] | None  # None: all models
    rpm_limit: int  # the key's own rpm, else the tenant's
    tenant_rpm: int
    tpm_limit: int
    budget_tokens: int | None
    budget_usd: Decimal | None
    budget_period: str  # day | month (UTC)
    cache_enabled: bool
    cache_threshold: float
    cache_ttl_s: int
    cache_max_entries: int
    cache_namespace: str = ""  # its semantic-cache entries' namespace (``tenancy.cache_namespace``)

    def may_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else int(value)


def build_principal(tenant: Tenant, key: ApiKey, settings: Settings) -> Principal:
    tenant_rpm = _or_default(tenant.rpm_limit, settings.default_rpm)
    return Principal(
        tenant_id=tenant.id, tenant_name=tenant.name, key_id=key.id, key_prefix=key.prefix,
        key_hash=key.key_hash,
        allowed_models=list(key.allowed_models) if key.allowed_models else None,
        rpm_limit=_or_default(key.rpm_limit, tenant_rpm), tenant_rpm=tenant_rpm,
        tpm_limit=_or_default(tenant.tpm_limit, settings.default_tpm),
        budget_tokens=tenant.budget_tokens,
        budget_usd=None if tenant.budget_usd is None else Decimal(tenant.budget_usd),
        budget_period=tenant.budget_period or "month",
        cache_enabled=bool(tenant.cache_enabled) and settings.cache_enabled,
        cache_threshold=tenant.cache_threshold if tenant.cache_threshold is not None else settings.cache_threshold,
        cache_ttl_s=_or_default(tenant.cache_ttl_s, settings.cache_ttl_s),
        cache_max_entries=_or_default(tenant.cache_max_entries, settings.cache_max_entries),
        cache_namespace=cache_namespace(tenant),
    )


@dataclass(slots=True)
class _Entry:
    principal: Principal | None  # None: unknown or revoked key (negative cache)
    disabled: bool
    expires_at: float


class Authenticator:
    """``await authenticate(header)`` → Principal, or ApiError 401 ``invalid_api_key`` /
    403 ``tenant_disabled``. ``start()`` subscribes to invalidations; ``close()`` stops that."""

    MAX_ENTRIES = 50_000
    NEGATIVE_TTL_S = 5.0

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], redis: Redis, settings: Settings,
                 *, version_poll_s: float = 0.2) -> None:
        self._sessionmaker = sessionmaker
        self._redis = redis
        self._settings = settings
        self._prefix = settings.redis_prefix
        self._ttl_s = settings.key_cache_ttl_s
        self._poll_s = version_poll_s
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._generation = 0  # bumped on every local invalidation
        self._version: bytes | None = None  # last seen Redis version counter
        self._version_checked = -1e18
        self._listener: asyncio.Task | None = None
        self._loading: dict[str, asyncio.Task] = {}  # key hash -> its one load in flight
        self._background: set[asyncio.Task] = set()  # version reads, refreshes of stale principals
        self._redis_trouble: dict[tuple[str, str], LogThrottle] = {}  # (what failed, error type) -> its throttle
        self.db_outage = Outage()  # the database as the key lookups last found it (gateway.probes)

    async def start(self) -> None:
        if self._listener is None:
            ready = asyncio.Event()
            self._listener = asyncio.create_task(self._listen(ready), name="auth-invalidation")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), 2.0)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None

    async def authenticate(self, authorization_header: str | None, *, query_string: bytes = b"") -> Principal:
        """``query_string``: the request's, to say so when a key was put in the URL instead."""
        key = bearer_token(authorization_header)
        if key is None:
            raise invalid_api_key(_no_key(authorization_header, query_string))
        if not looks_like_key(key):
            raise invalid_api_key()
        try:
            entry = await self._entry(hash_key(key))
        except Exception as exc:  # never seen and the database is unreachable
            raise ApiError(503, "Authentication is temporarily unavailable; retry shortly.",
                           "server_error", "auth_unavailable", headers={"retry-after": "1"}) from exc
        if entry.principal is None:
            raise invalid_api_key()
        if entry.disabled:
            raise permission_denied(f"Tenant '{entry.principal.tenant_name}' is disabled.",
                                    code="tenant_disabled")
        return entry.principal

    async def still_valid(self, principal: Principal) -> bool:
        """Whether ``principal``'s key still authenticates (not revoked, its tenant neither disabled
        nor deleted), as of the last invalidation this process heard of; False when that cannot be
        told (the database down for a key no longer cached). For work done after a request's answer
        that must not outlive its tenant: the semantic cache's store (found by a review: a request
        running while its tenant was deleted stored its answer after the purge, for 24 h)."""
        try:
            entry = await self._entry(principal.key_hash)
        except Exception:  # noqa: BLE001 - unknown: do not act for it
            return False
        return entry.principal is not None and not entry.disabled

    async def _entry(self, key_hash: str) -> _Entry:
        """A key's cache entry, loaded when missing (or a negative one expired), refreshed in the
        background when stale. Raises when it must be loaded and the database does not answer."""
        self._poll_version()
        entry = self._cache.get(key_hash)
        if entry is None or (entry.principal is None and entry.expires_at < time.monotonic()):
            try:
                entry = await self._load_once(key_hash)
                self.db_outage.reached()
            except Exception as exc:
                self.db_outage.failed(exc, timeout_s=self._settings.database_timeout_s)
                # (once per 10 s: a re-check saw a line per unknown key while it was down)
                _LOOKUP_FAILED.log(log, logging.WARNING, "auth: cannot read keys from the database: %s",
                                   self.db_outage.error)
                raise
        elif entry.expires_at < time.monotonic() and key_hash not in self._loading:
            self._in_background(self._refresh(key_hash))  # served as it is meanwhile
        return entry

    async def invalidate_key(self, key_hash: str) -> None:
        """Drop a key everywhere (this process at once, others through Redis)."""
        self._drop(f"key:{key_hash}")
        await publish_invalidation(self._redis, self._prefix, key_hash=key_hash)

    async def invalidate_tenant(self, tenant_id: int) -> None:
        self._drop(f"tenant:{tenant_id}")
        await publish_invalidation(self._redis, self._prefix, tenant_id=tenant_id)

    async def invalidate_all(self) -> None:
        self._drop("all")
        await publish_invalidation(self._redis, self._prefix)

    # -- internals -------------------------------------------------------------------------------

    def _load_once(self, key_hash: str) -> asyncio.Future:
        """The key's load, shared by every request that asks while it runs."""
        task = self._loading.get(key_hash)
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = self._loading[key_hash] = asyncio.ensure_future(self._load(key_hash))
            task.add_done_callback(lambda t, h=key_hash: self._loading.pop(h, None) if self._loading.get(h) is t
                                   else None)
        return asyncio.shield(task)  # a caller that leaves does not cancel the others' load

    async def _refresh(self, key_hash: str) -> None:
        try:
            await self._load_once(key_hash)
            self.db_outage.reached()
        except Exception as exc:  # DB hiccup: keep serving what we knew (invalidations still drop it)
            self.db_outage.failed(exc, timeout_s=self._settings.database_timeout_s)
            # (once per 10 s: while the database is down every request's refresh fails, 135 lines in 23 s)
            _REFRESH_FAILED.log(log, logging.WARNING, "auth: cannot refresh a key from the database: %r", exc)

    def _in_background(self, coro) -> None:  # noqa: ANN001 - a coroutine
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _poll_version(self) -> None:
        now = time.monotonic()
        if now - self._version_checked >= self._poll_s:
            self._version_checked = now
            self._in_background(self._check_version())

    async def _load(self, key_hash: str) -> _Entry:
        generation = self._generation
        async with self._sessionmaker() as session:
            row = (await session.execute(
                select(ApiKey, Tenant).join(Tenant, ApiKey.tenant_id == Tenant.id)
                .where(ApiKey.key_hash == key_hash))).first()
        now = time.monotonic()
        if row is None or row[0].revoked or row[1].deleted_at is not None:  # a deleted tenant's keys: unknown
            entry = _Entry(None, False, now + self.NEGATIVE_TTL_S)
        else:
            key, tenant = row
            entry = _Entry(build_principal(tenant, key, self._settings), not tenant.enabled, now + self._ttl_s)
        if generation == self._generation:  # no invalidation arrived while we read the DB
            self._cache[key_hash] = entry
            self._cache.move_to_end(key_hash)
            while len(self._cache) > self.MAX_ENTRIES:
                self._cache.popitem(last=False)
        return entry

    def _drop(self, message: str) -> None:
        self._generation += 1
        kind, _, value = message.partition(":")
        if kind == "key":
            self._cache.pop(value, None)
        elif kind == "tenant" and value.isdigit():
            tid = int(value)
            for h in [h for h, e in self._cache.items() if e.principal and e.principal.tenant_id == tid]:
                del self._cache[h]
        else:
            self._cache.clear()

    async def _check_version(self) -> None:
        try:
            version = await self._redis.get(invalidation_version_key(self._prefix))
        except Exception as exc:  # Redis briefly away: keep serving from the cache (entries still expire)
            self._log_redis_trouble("cannot read the invalidation version from Redis", exc)
            return
        if version != self._version:
            if self._version is not None or self._cache:
                self._drop("all")
            self._version = version

    def _log_redis_trouble(self, what: str, exc: Exception) -> None:
        """One line per kind of failure every 10 s while Redis is away (the listener retries every
        0.5 s); the traceback only at DEBUG."""
        kind = type(exc).__name__
        throttle = self._redis_trouble.setdefault((what, kind), LogThrottle())
        reason = (str(exc).strip().splitlines() or [""])[0]
        if throttle.log(log, logging.WARNING, "auth: %s: %s: %s", what, kind, reason):
            log.debug("auth: %s", what, exc_info=exc)

    async def _listen(self, ready: asyncio.Event) -> None:
        def lost(exc: Exception) -> None:
            self._log_redis_trouble("invalidation listener lost Redis; retrying", exc)
            self._drop("all")  # we may have missed messages

        await listen_forever(self._redis, invalidation_channel(self._prefix, self._redis),
                             lambda data: self._drop(data.decode() if isinstance(data, bytes) else str(data)),
                             on_subscribed=ready.set, on_lost=lost)


_SCHEMES = frozenset(("basic", "digest", "token", "apikey", "api-key", "key", "negotiate", "ntlm", "hoba", "mutual",
                      "aws4-hmac-sha256", "dpop", "gnap", "privatetoken", "scram-sha-256", "vapid", "oauth"))


def _no_key(header: str | None, query_string: bytes) -> str:
    """Why a request has no key, as the client sent it (found by QA: a ``Basic`` header and a key in
    the URL were both told they sent no key). Never echoes what was sent beyond the scheme's name."""
    send = "Send 'Authorization: Bearer pg-...'."
    if header and header.strip():
        scheme, space, _ = header.strip().partition(" ")
        if scheme.lower() == "bearer":
            return f"The Authorization header holds no API key after 'Bearer'. {send}"
        if space and scheme.lower() in _SCHEMES:  # (only a known scheme's name: a bare token would be
            # the secret itself, found by a review)
            return f"The Authorization header uses the {scheme!r} scheme; API keys are sent as a Bearer token. {send}"
        return f"The Authorization header holds no 'Bearer' scheme; API keys are sent as a Bearer token. {send}"
    names = {part.partition(b"=")[0].lower() for part in query_string.split(b"&")}
    if names & {b"api_key", b"api-key", b"apikey", b"key", b"token", b"access_token"}:
        return f"API keys are not read from the URL (where logs and proxies keep them). {send}"
    return f"You didn't provide an API key. {send}"


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for any other."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None
