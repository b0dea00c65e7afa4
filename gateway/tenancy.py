"""Tenant, key and price management: plain service functions with keyword-only arguments, used by
dev mode, the admin CLI and the admin API. They only touch the database session (the caller
commits); pushing a revocation or a disabled tenant to every gateway process is the caller's job
through ``publish_invalidation`` (Redis only, so the CLI can call it without a running gateway)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from redis.asyncio import Redis
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.db.models import ApiKey, ModelPrice, Tenant
from gateway.keys import NewKey, generate_key

PERIODS = ("day", "month")


class TenancyError(ValueError):
    """A management request that cannot be done (unknown tenant, duplicate name, bad value)."""


class TenantExists(TenancyError):
    """The tenant name is taken (the admin surfaces answer it as a conflict, not a bad value)."""


def _check_limits(rpm: int | None, tpm: int | None, budget_tokens: int | None,
                  budget_usd: Decimal | float | str | None, period: str) -> None:
    if period not in PERIODS:
        raise TenancyError(f"period must be one of {PERIODS}, not {period!r}")
    for name, value in (("rpm", rpm), ("tpm", tpm), ("budget_tokens", budget_tokens)):
        if value is not None and int(value) < 0:
            raise TenancyError(f"{name} must be >= 0")
    if budget_usd is not None and Decimal(str(budget_usd)) < 0:
        raise TenancyError("budget_usd must be >= 0")


async def get_tenant(session: AsyncSession, *, tenant_id: int | None = None,
                     name: str | None = None) -> Tenant | None:
    """The tenant by id or by name (exactly one must be given); None when absent."""
    if (tenant_id is None) == (name is None):
        raise TenancyError("give exactly one of tenant_id or name")
    if tenant_id is not None:
        return await session.get(Tenant, tenant_id)
    return (await session.execute(select(Tenant).where(Tenant.name == name))).scalar_one_or_none()


async def tenant_named_alike(session: AsyncSession, name: str) -> Tenant | None:
    """A tenant (deleted ones too) whose name is ``name`` but for case: names are told apart only
    by more than case (found by QA: "acme" and "ACME" were two tenants, and a command typed with
    the wrong case acted on the other one)."""
    rows = await session.execute(select(Tenant).where(func.lower(Tenant.name) == name.lower()).limit(1))
    return rows.scalar_one_or_none()


async def _require_tenant(session: AsyncSession, tenant_id: int | None, tenant_name: str | None) -> Tenant:
    tenant = await get_tenant(session, tenant_id=tenant_id, name=tenant_name)
    if tenant is None:
        raise TenancyError(f"no tenant {tenant_name or tenant_id!r}")
    return tenant


RESERVED_NAME = "TOTAL"  # the last line of a report's or the summary's CSV (admin.reports.to_csv)


async def create_tenant(
    session: AsyncSession,
    *,
    name: str,
    rpm: int | None = None,
    tpm: int | None = None,
    budget_tokens: int | None = None,
    budget_usd: Decimal | float | str | None = None,
    period: str = "month",
    enabled: bool = True,
    cache_enabled: bool = True,
    cache_threshold: float | None = None,
    cache_ttl_s: int | None = None,
    cache_max_entries: int | None = None,
) -> Tenant:
    """Add a tenant (flushed, not committed). ``rpm``/``tpm`` None means the settings' defaults
    (``default_rpm``/``default_tpm``), 0 means unlimited; budgets None mean no budget."""
    # stored exactly as checked: stripping here would let "acme\n" past a caller's duplicate check
    if not name or name != name.strip():
        raise TenancyError("tenant name must not be empty or start or end with whitespace")
    if name.casefold() == RESERVED_NAME.casefold():  # found by QA: two TOTAL lines in the summary's CSV
        raise TenancyError(f"the tenant name {name!r} is reserved: the reports' CSV names its sum line "
                           f"{RESERVED_NAME}")
    _check_limits(rpm, tpm, budget_tokens, budget_usd, period)
    held = await tenant_named_alike(session, name)
    if held is not None:
        raise TenantExists(f"tenant {held.name!r} already exists" + ("" if held.name == name else
                                                                     " (names are compared without case)"))
    tenant = Tenant(
        name=name, enabled=enabled, rpm_limit=rpm, tpm_limit=tpm, budget_tokens=budget_tokens,
        budget_usd=None if budget_usd is None else Decimal(str(budget_usd)), budget_period=period,
        cache_enabled=cache_enabled, cache_threshold=cache_threshold, cache_ttl_s=cache_ttl_s,
        cache_max_entries=cache_max_entries,
    )
    session.add(tenant)
    await session.flush()
    return tenant



async def update_tenant(session: AsyncSession, *, tenant_id: int | None = None,
                        tenant_name: str | None = None, **changes: object) -> Tenant:
    """Change tenant fields (``rpm``, ``tpm``, ``budget_tokens``, ``budget_usd``, ``period`` or any
    Tenant column name). Callers then ``publish_invalidation(..., tenant_id=...)``."""
    tenant = await _require_tenant(session, tenant_id, tenant_name)
    alias = {"rpm": "rpm_limit", "tpm": "tpm_limit", "period": "budget_period"}
    for key, value in changes.items():
        col = alias.get(key, key)
        if col in ("id", "created_at", "updated_at") or not hasattr(Tenant, col):
            raise TenancyError(f"unknown tenant field {key!r}")
        if col == "budget_usd" and value is not None:
            value = Decimal(str(value))
        setattr(tenant, col, value)
    _check_limits(tenant.rpm_limit, tenant.tpm_limit, tenant.budget_tokens, tenant.budget_usd,
                  tenant.budget_period)
    await session.flush()
    return tenant


async def set_tenant_enabled(session: AsyncSession, *, enabled: bool, tenant_id: int | None = None,
                             tenant_name: str | None = None) -> Tenant:
    """Enable or disable a tenant. Disabled tenants get 403 on every key."""
    tenant = await _require_tenant(session, tenant_id, tenant_name)
    tenant.enabled = enabled
    await session.flush()
    return tenant


async def create_api_key(
    session: AsyncSession,
    *,
    tenant_id: int | None = None,
    tenant_name: str | None = None,
    name: str | None = None,
    allowed_models: list[str] | None = None,
    rpm: int | None = None,
) -> tuple[ApiKey, NewKey]:
    """Mint a key for a tenant. Returns the row and the ``NewKey`` whose ``.key`` is shown once
    (only its SHA-256 hash and display prefix are stored). ``allowed_models`` None: all models;
    a list must name at least one model, none of them empty."""
    tenant = await _require_tenant(session, tenant_id, tenant_name)
    if rpm is not None and rpm < 0:
        raise TenancyError("rpm must be >= 0")
    if allowed_models is not None and (not allowed_models or not all(m and m.strip() for m in allowed_models)):
        raise TenancyError("allowed_models must name at least one model, none empty (null: all models)")
    new = generate_key()
    row = ApiKey(tenant_id=tenant.id, key_hash=new.key_hash, prefix=new.prefix, name=name,
                 allowed_models=None if allowed_models is None else list(allowed_models), rpm_limit=rpm,
                 revoked=False)
    session.add(row)
    await session.flush()
    return row, new


async def revoke_key(session: AsyncSession, *, key_id: int | None = None,
                     prefix: str | None = None) -> ApiKey:
    """Revoke a key by id or by its display prefix. Callers then
    ``publish_invalidation(redis, prefix, key_hash=row.key_hash)``."""
    if (key_id is None) == (prefix is None):
        raise TenancyError("give exactly one of key_id or prefix")
    if key_id is not None:
        row = await session.get(ApiKey, key_id)
    else:
        rows = (await session.execute(select(ApiKey).where(ApiKey.prefix == prefix))).scalars().all()
        if len(rows) > 1:
            raise TenancyError(f"prefix {prefix!r} is ambiguous; use the key id")
        row = rows[0] if rows else None
    if row is None:
        raise TenancyError(f"no key {key_id or prefix!r}")
    if not row.revoked:
        await revoke_active_key(session, key_id=row.id)
        await session.refresh(row)
    return row


async def revoke_active_key(session: AsyncSession, *, key_id: int) -> bool:
    """Revoke the key if it is still active, in one conditional UPDATE (not committed). True when
    this call revoked it, False when it was revoked already. Of several callers at once exactly one
    gets True: the others wait on the row (PostgreSQL) or the write lock (SQLite) and then find it
    revoked. Objects in the session are not updated: refresh the key's row to see the change."""
    result = await session.execute(
        update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked.is_(False))
        .values(revoked=True, revoked_at=datetime.now(UTC))
        .execution_options(synchronize_session=False))
    return result.rowcount == 1


async def list_keys(session: AsyncSession, *, tenant_id: int) -> list[ApiKey]:
    return list((await session.execute(
        select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id))).scalars())


async def set_price(session: AsyncSession, *, model: str, prompt_usd_per_1m: Decimal | float | str,
                    completion_usd_per_1m: Decimal | float | str,
                    cached_prompt_usd_per_1m: Decimal | float | str | None = None) -> ModelPrice:
    """Insert or update a model's price (USD per 1M prompt / completion tokens, and per 1M prompt
    tokens served from the prefix cache: None bills them as other prompt tokens)."""
    p, c = Decimal(str(prompt_usd_per_1m)), Decimal(str(completion_usd_per_1m))
    cp = None if cached_prompt_usd_per_1m is None else Decimal(str(cached_prompt_usd_per_1m))
    if p < 0 or c < 0 or (cp is not None and cp < 0):
        raise TenancyError("prices must be >= 0")
    row = await session.get(ModelPrice, model)
    if row is None:
        row = ModelPrice(model=model, prompt_usd_per_1m=p, completion_usd_per_1m=c, cached_prompt_usd_per_1m=cp)
        session.add(row)
    else:
        row.prompt_usd_per_1m, row.completion_usd_per_1m, row.cached_prompt_usd_per_1m = p, c, cp
    await session.flush()
    return row


async def bootstrap_dev_tenant(session: AsyncSession, *, name: str = "default") -> tuple[str, str] | None:
    """Development mode: on a database without (live) tenants create tenant ``name`` and one key
    (flushed, not committed), and return (the tenant's name, the key) (to print once); None when
    tenants exist. A deleted tenant keeps its name: then the new one is ``name-2`` (or the next
    free number), and that is the name returned."""
    if (await session.execute(select(Tenant.id).where(Tenant.deleted_at.is_(None)).limit(1))).first() is not None:
        return None
    taken = set((await session.execute(select(Tenant.name).where(Tenant.name.startswith(name)))).scalars())
    free = next(n for n in (name, *(f"{name}-{i}" for i in range(2, 10**6))) if n not in taken)
    tenant = await create_tenant(session, name=free)
    _, new = await create_api_key(session, tenant_id=tenant.id, name="dev")
    return free, new.key


def invalidation_channel(prefix: str, redis: object) -> str:
    """The channel of ``redis``' database number: Redis delivers a message to every subscriber of
    the server whatever database it selected, so a deployment on another database of the same
    server (with the same prefix) would drop its cache entries and count as a gateway that heard
    (found by QA: the CLI's "no gateway heard it" warning was fooled by another deployment)."""
    db = redis.connection_pool.connection_kwargs.get("db", 0)  # type: ignore[attr-defined]
    return f"{prefix}auth:invalidate:db{db}"


def invalidation_version_key(prefix: str) -> str:
    return f"{prefix}auth:version"


async def publish_invalidation(redis: Redis, prefix: str, *, key_hash: str | None = None,
                               tenant_id: int | None = None) -> int:
    """Tell every gateway process to drop cached principals: of one key, of one tenant, or all
    (neither given). Bumps a version counter (polled as a fallback) then publishes on a channel.
    Returns how many processes heard it (Redis's answer to PUBLISH): 0 when no gateway shares
    this Redis and prefix."""
    if key_hash is not None:
        message = f"key:{key_hash}"
    elif tenant_id is not None:
        message = f"tenant:{tenant_id}"
    else:
        message = "all"
    await redis.incr(invalidation_version_key(prefix))
    return int(await redis.publish(invalidation_channel(prefix, redis), message))


def cache_namespace(tenant: Tenant) -> str:
    """The tenant's semantic-cache namespace: its id and its creation time (µs), so that a tenant
    id used again (a database reset or restored while Redis kept its keys, staging and production
    on one Redis) never reads another tenant's stored prompts and answers (found by QA: a new
    tenant 1 on a fresh database was served the old tenant 1's answers)."""
    created = tenant.created_at
    if created is None:
        return str(tenant.id)
    if created.tzinfo is None:  # (SQLite gives it back naive: UTC)
        created = created.replace(tzinfo=UTC)
    return f"{tenant.id}.{(created - _EPOCH) // _MICROSECOND}"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


async def purge_cached_answers(redis: Redis, prefix: str, tenant_id: int,
                               namespace: str | None = None) -> tuple[int, int]:
    """Delete a tenant's semantic-cache entries (its prompts and the answers stored for them) at
    once, instead of at their TTL (a deleted tenant's, found by QA: 24 h by default). Returns how
    many answers (entries) and how many Redis keys in all went (each tenant also has its index
    keys: its entry set, stamps, sequence and change log). (``cache.store`` keeps a tenant's keys
    under one hash-tagged base.)"""
    from cache.store import TenantKeys

    keys = entries = 0
    # (its namespace, and the bare id under which releases before the namespace stored them)
    for ns in dict.fromkeys(n for n in (namespace, str(tenant_id)) if n):
        tenant_keys = TenantKeys.of(prefix, ns)
        entry_prefix = tenant_keys.entry_prefix.encode()
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in tenant_keys.base) + "*"
        batch: list[bytes] = []
        async for key in redis.scan_iter(match=pattern, count=1000):
            batch.append(key)
            entries += (key if isinstance(key, bytes) else key.encode()).startswith(entry_prefix)
            if len(batch) >= 500:
                keys += await redis.unlink(*batch)
                batch = []
        if batch:
            keys += await redis.unlink(*batch)
    return entries, keys
