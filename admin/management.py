"""Audited management operations shared by the admin API, CLI and dashboard.

Each write goes through ``gateway.tenancy``'s service functions, adds an audit row (actor, action,
target, before → after) in the same transaction, commits, and only then publishes a Redis
invalidation when the change must reach running gateways (a key revoked or rotated, a tenant
disabled or its limits changed), so no gateway re-reads the old state after the push. A write that
changes nothing adds no audit row and publishes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import Row, Select, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from admin import audit
from admin.checks import TENANT_FIELDS, check_money, checked_new_tenant, checked_price, only
from admin.schemas import (
    INT32_MAX,
    KeyCreate,
    TenantLimits,
    validated,
)
from gateway import tenancy
from gateway.db.models import ApiKey, AuditLog, ModelPrice, Tenant
from gateway.errors import ApiError, cut_name
from gateway.keys import NewKey
from gateway.quota import forget_counter, period_bounds, period_usage
from gateway.settings import Settings

log = logging.getLogger("pagegate.admin")

PAGE_SIZE = 100  # a list's page when the caller gives no limit
MAX_PAGE_SIZE = 1000  # the API's largest page (the CLI, on the database itself, may ask for more)


def priced_model(settings: Settings, model: str) -> str:
    """The name a price is kept under: the embedding model's served id for any of its aliases (usage
    rows name it so: found by QA, a price set on an alias was taken and never applied)."""
    from gateway.embedding_service import is_embedding_model

    return settings.embedding_model if is_embedding_model(settings, model) else model


class NotFound(LookupError):
    """The tenant, key or price named does not exist."""


class Conflict(ValueError):
    """The change clashes with existing state (e.g. a duplicate tenant name)."""


def tenant_view(t: Tenant) -> dict:
    return audit.jsonable({
        "id": t.id, "name": t.name, "enabled": t.enabled, "rpm": t.rpm_limit, "tpm": t.tpm_limit,
        "budget_tokens": t.budget_tokens, "budget_usd": t.budget_usd, "period": t.budget_period,
        "cache_enabled": t.cache_enabled, "cache_threshold": t.cache_threshold, "cache_ttl_s": t.cache_ttl_s,
        "cache_max_entries": t.cache_max_entries, "created_at": t.created_at, "updated_at": t.updated_at,
        "deleted_at": t.deleted_at,
    })


def key_view(k: ApiKey, tenant_name: str | None = None) -> dict:
    return audit.jsonable({
        "id": k.id, "tenant_id": k.tenant_id, "tenant": tenant_name, "prefix": k.prefix, "name": k.name,
        "allowed_models": k.allowed_models, "rpm": k.rpm_limit, "revoked": k.revoked,
        "created_at": k.created_at, "revoked_at": k.revoked_at, "last_used_at": k.last_used_at,
    })


def price_view(p: ModelPrice) -> dict:
    return audit.jsonable({"model": p.model, "prompt_usd_per_1m": p.prompt_usd_per_1m,
                           "completion_usd_per_1m": p.completion_usd_per_1m,
                           "cached_prompt_usd_per_1m": p.cached_prompt_usd_per_1m, "updated_at": p.updated_at})


@dataclass(slots=True)
class Page:
    """One page of a list in id order, as the API sends it (OpenAI's list shape). The next page
    is the one ``after=last_id``; ``has_more`` says whether it holds anything (as of this read)."""

    data: list[dict]
    has_more: bool

    def as_dict(self) -> dict:
        return {"object": "list", "data": self.data, "has_more": self.has_more,
                "first_id": self.data[0]["id"] if self.data else None,
                "last_id": self.data[-1]["id"] if self.data else None}


async def _keyset_page(session: AsyncSession, query: Select, id_column: InstrumentedAttribute[int], *,
                       limit: int | None, after: int | None, newest_first: bool = False) -> tuple[list[Row], bool]:
    """The rows of ``query`` past ``after`` in id order, at most ``limit`` (None: all), and whether
    more follow (one extra row is read to know). Keyset, not OFFSET: a row added between two pages
    gets a higher id, so it neither shifts later pages (no skip, no repeat) nor lands on a page
    already read of a newest-first list. (On PostgreSQL a row whose transaction commits after a
    later-numbered one's, e.g. a key created while it waited for its tenant's lock, is missed by a
    client already past that id: a QA find, documented in the README's Lists.)"""
    if after is not None:
        query = query.where(id_column < after if newest_first else id_column > after)
    query = query.order_by(id_column.desc() if newest_first else id_column.asc())
    if limit is not None:
        query = query.limit(limit + 1)
    rows = list((await session.execute(query)).all())
    if limit is not None and len(rows) > limit:
        return rows[:limit], True
    return rows, False


@dataclass(slots=True)
class Management:
    """One unit of admin work: a session, who does it, and where invalidations go."""

    session: AsyncSession
    actor: str
    redis: Redis | None = None
    redis_prefix: str = "pg:"
    invalidation_failed: bool = False
    invalidation_unheard: bool = False  # published, but no process listens on that Redis and prefix
    counter_kept: bool = False  # a budget period changed, but its Redis counter could not be dropped
    cache_kept: bool = False  # a tenant deleted, but its semantic-cache entries could not be purged

    # --- reads ---------------------------------------------------------------------------------
    async def tenant(self, name: str, *, include_deleted: bool = False) -> Tenant:
        """A tenant that exists. A deleted one is not found, unless ``include_deleted``: the
        read-only views of its history (report, budget, keys) still find it; changes never do."""
        tenant = await tenancy.get_tenant(self.session, name=name)
        if tenant is None or (tenant.deleted_at is not None and not include_deleted):
            raise NotFound(f"No tenant named {cut_name(name)!r}.")
        return tenant

    async def tenants(self) -> list[Tenant]:
        """Every tenant but the deleted ones, by name (the dashboard's and the CLI's tables)."""
        return list((await self.session.execute(
            select(Tenant).where(Tenant.deleted_at.is_(None)).order_by(Tenant.name))).scalars())

    async def tenant_page(self, *, limit: int | None = PAGE_SIZE, after: int | None = None) -> Page:
        """Tenants but the deleted ones by id, past the tenant id ``after``; ``limit`` None: all."""
        rows, more = await _keyset_page(self.session, select(Tenant).where(Tenant.deleted_at.is_(None)), Tenant.id,
                                        limit=limit, after=after)
        return Page([tenant_view(t) for (t,) in rows], more)

    async def delete_tenant(self, name: str) -> tuple[Tenant, int]:
        """Delete a tenant: its keys revoked (gateways refuse them within 1 s), the tenant disabled
        and marked deleted, one audit row. Its row, name and usage rows stay, so reports and bills
        keep it; admin lists and lookups leave it out and its name is not free again. Returns the
        tenant and how many keys this revoked. Two deletes at once: one deletes, the other 404s."""
        tenant = await self.tenant(name)
        before = tenant_view(tenant)
        now = datetime.now(UTC)
        marked = await self.session.execute(
            update(Tenant).where(Tenant.id == tenant.id, Tenant.deleted_at.is_(None))
            .values(deleted_at=now, enabled=False).execution_options(synchronize_session=False))
        if marked.rowcount != 1:  # deleted by someone else since we read it
            await self.session.rollback()
            raise NotFound(f"No tenant named {cut_name(name)!r}.")
        revoked = await self.session.execute(
            update(ApiKey).where(ApiKey.tenant_id == tenant.id, ApiKey.revoked.is_(False))
            .values(revoked=True, revoked_at=now).execution_options(synchronize_session=False))
        await self.session.refresh(tenant)
        namespace = tenancy.cache_namespace(tenant)
        audit.record(self.session, actor=self.actor, action="tenant.delete", target=f"tenant:{tenant.name}",
                     before=before, after=tenant_view(tenant), detail=f"{revoked.rowcount} key(s) revoked")
        await self.session.commit()
        await self._invalidate(tenant_id=tenant.id)
        await self._purge_cache(tenant.id, namespace)
        return tenant, int(revoked.rowcount)

    async def _purge_cache(self, tenant_id: int, namespace: str) -> None:
        """A deleted tenant's cached prompts and answers go at once (QA: they stayed until their TTL,
        24 h by default, unreadable but kept). The delete is already committed: if Redis is down they
        expire at their TTL as before (logged)."""
        if self.redis is None:
            return
        try:
            await tenancy.purge_cached_answers(self.redis, self.redis_prefix, tenant_id, namespace)
        except RedisError as exc:
            self.cache_kept = True
            log.warning("tenant deleted but its semantic-cache entries could not be purged (%s); they expire "
                        "at their TTL", exc)

    async def key(self, ref: int | str) -> ApiKey:
        """A key by numeric id or by display prefix (``pg-…``)."""
        # ASCII digits only: str.isdigit() also takes '²' or '٣', which int() then refuses
        if isinstance(ref, int) or (str(ref).isascii() and str(ref).isdigit()):
            key_id = int(ref)  # ids past the column's range cannot exist (and would overflow the driver)
            row = await self.session.get(ApiKey, key_id) if 0 < key_id <= INT32_MAX else None
        else:
            rows = (await self.session.execute(select(ApiKey).where(ApiKey.prefix == ref))).scalars().all()
            if len(rows) > 1:
                raise Conflict(f"Prefix {ref!r} matches {len(rows)} keys; use the key id.")
            row = rows[0] if rows else None
        if row is None:
            raise NotFound(f"No API key {cut_name(str(ref))!r}.")
        return row

    async def key_page(self, *, tenant: Tenant | None = None, prefix: str | None = None,
                       include_revoked: bool = True, limit: int | None = PAGE_SIZE,
                       after: int | None = None) -> Page:
        """Matching keys by id, past the key id ``after``; ``limit`` None: all of them."""
        query = _key_query(tenant=tenant, prefix=prefix, include_revoked=include_revoked)
        rows, more = await _keyset_page(self.session, query, ApiKey.id, limit=limit, after=after)
        return Page([key_view(k, n) for k, n in rows], more)

    async def owner(self, key: ApiKey) -> str:
        """The name of the key's tenant."""
        return (await self.session.get_one(Tenant, key.tenant_id)).name

    async def audit_page(self, *, target: str | None = None, action: str | None = None,
                         limit: int | None = PAGE_SIZE, after: int | None = None) -> Page:
        """Audit entries newest first, older than the entry id ``after``; ``limit`` None: all of them."""
        query = select(AuditLog)
        if target:
            query = query.where(AuditLog.target == target)
        if action:
            query = query.where(AuditLog.action == action)
        rows, more = await _keyset_page(self.session, query, AuditLog.id, limit=limit, after=after,
                                        newest_first=True)
        return Page([audit.entry_view(e) for (e,) in rows], more)

    async def prices(self) -> list[ModelPrice]:
        return list((await self.session.execute(select(ModelPrice).order_by(ModelPrice.model))).scalars())

    async def budget(self, tenant: Tenant, now: datetime | None = None) -> dict:
        """The tenant's budget and what its usage rows in the current period ``[start, end)`` spent,
        counted as the gateway's quota ledger counts them (``period_usage``: cache hits used no
        engine tokens and cost nothing; a row dated past the period, by clock skew or a backfill,
        is not this period's)."""
        _, start, end = period_bounds(tenant.budget_period, now or datetime.now(UTC))
        spent_tokens, spent_usd = await period_usage(self.session, tenant.id, start, end)
        return audit.jsonable({
            "tenant": tenant.name, "period": tenant.budget_period, "period_start": start,
            "budget_tokens": tenant.budget_tokens, "budget_usd": tenant.budget_usd,
            "spent_tokens": spent_tokens, "spent_usd": spent_usd, "deleted_at": tenant.deleted_at,
        })

    # --- writes --------------------------------------------------------------------------------
    async def create_tenant(self, *, name: str, **fields: object) -> Tenant:
        """Add a tenant. Raises ``InvalidField`` for a bad name or value, ``Conflict`` when taken."""
        fields = checked_new_tenant(self._dialect(), name=name, **fields)
        name = fields.pop("name")
        try:
            tenant = await tenancy.create_tenant(self.session, name=name, **fields)
            await self.session.refresh(tenant)
            audit.record(self.session, actor=self.actor, action="tenant.create", target=f"tenant:{tenant.name}",
                         after=tenant_view(tenant))
            await self.session.commit()
        # TenantExists: found by the service's check (perhaps just committed by another admin);
        # IntegrityError: created concurrently and committed between that check and our insert
        except (tenancy.TenantExists, IntegrityError) as exc:
            await self.session.rollback()
            held = await tenancy.tenant_named_alike(self.session, name)
            alike = "" if held is None or held.name == name else f" as {held.name!r} (names are compared without case)"
            if held is not None and held.deleted_at is not None:
                raise Conflict(f"Tenant {name!r} was deleted{alike}; its name stays with its usage history. "
                               "Choose another name.") from exc
            raise Conflict(f"Tenant {name!r} already exists{alike}.") from exc
        return tenant

    async def update_tenant(self, name: str, **changes: object) -> Tenant:
        """Change the fields given (``None`` clears a limit or budget); see ``apply_tenant_update``."""
        return (await self.apply_tenant_update(name, **changes))[0]

    async def apply_tenant_update(self, name: str, **changes: object) -> tuple[Tenant, dict]:
        """Change the fields given (``None`` clears a limit or budget): one audit row per call that
        changes something. Returns the tenant and the changes that took effect; empty when the call
        changed nothing (disabling a disabled tenant, the values it already has): then no audit row
        is written and no invalidation pushed. The tenant is compared under its row lock, so of two
        identical changes at once only the first is recorded: the second sees its result."""
        only(changes, TENANT_FIELDS)
        changes = validated(TenantLimits, changes).changes()
        check_money(self._dialect(), changes)
        tenant = await self._locked_tenant(name)
        before = tenant_view(tenant)
        # compared as the views show them: budget_usd 25 equals the stored 25.00000000
        changes = {k: v for k, v in changes.items() if audit.jsonable(v) != before[k]}
        if not changes:
            await self.session.commit()  # releases the row lock
            return tenant, {}
        await tenancy.update_tenant(self.session, tenant_id=tenant.id, **changes)
        await self._refuse_if_deleted(tenant.id, name)  # (an enable racing a delete must not revive it)
        await self.session.refresh(tenant)
        action = "tenant.update"
        if set(changes) == {"enabled"}:
            action = "tenant.enable" if changes["enabled"] else "tenant.disable"
        audit.record(self.session, actor=self.actor, action=action, target=f"tenant:{tenant.name}",
                     before=before, after=tenant_view(tenant))
        await self.session.commit()
        if "period" in changes:
            await self._forget_counter(tenant.id, tenant.budget_period)
        await self._invalidate(tenant_id=tenant.id)
        return tenant, changes

    async def _locked_tenant(self, name: str) -> Tenant:
        """The tenant (not deleted) read again under a lock held until this transaction ends. Two
        admins changing it at once are serialized: the second reads what the first committed.
        PostgreSQL: ``FOR UPDATE`` waits for a change in flight. SQLite has no row locks: a write
        that changes nothing takes the database's write lock first, so the read that follows sees
        every commit made before it."""
        tenant = await self.tenant(name)
        if self._dialect() == "sqlite":
            await self.session.execute(  # (updated_at set to itself: its onupdate must not fire)
                update(Tenant).where(Tenant.id == tenant.id).values(updated_at=Tenant.updated_at)
                .execution_options(synchronize_session=False))
        locked = await self.session.scalar(
            select(Tenant).where(Tenant.id == tenant.id).with_for_update()
            .execution_options(populate_existing=True))
        if locked is None or locked.deleted_at is not None:  # deleted meanwhile
            await self.session.rollback()
            raise NotFound(f"No tenant named {cut_name(name)!r}.")
        return locked

    async def clear_cache(self, name: str) -> tuple[Tenant, int, int]:
        """Drop a tenant's semantic-cache entries now (a wrong answer found stored, new settings
        meant for every entry): its later requests are answered by the engine and stored afresh.
        Returns the tenant, how many answers and how many Redis keys in all went. One audit row.
        Needs Redis: without it, ``ApiError`` 503 (nothing to clear here, and nothing that could be
        told). A request of the tenant still running stores its answer when it ends, after the clear."""
        tenant = await self.tenant(name)
        if self.redis is None:
            raise ApiError(503, "The semantic cache lives in Redis, and this admin has none: PAGEGATE_REDIS_URL "
                           "is unset and no embedded Redis runs on this data directory (PAGEGATE_DATA_DIR: "
                           "use the gateway's).", "server_error", "redis_unavailable")
        try:
            entries, gone = await tenancy.purge_cached_answers(self.redis, self.redis_prefix, tenant.id,
                                                               tenancy.cache_namespace(tenant))
        except RedisError as exc:
            raise ApiError(503, f"Redis did not answer ({type(exc).__name__}); nothing was recorded. Retry "
                           "shortly.", "server_error", "redis_unavailable", headers={"retry-after": "1"}) from exc
        audit.record(self.session, actor=self.actor, action="tenant.cache_clear", target=f"tenant:{tenant.name}",
                     detail=f"{entries} answer(s) removed ({gone} Redis key(s))")
        await self.session.commit()
        return tenant, entries, gone

    async def set_enabled(self, name: str, enabled: bool) -> Tenant:
        return await self.update_tenant(name, enabled=enabled)

    async def apply_enabled(self, name: str, enabled: bool) -> tuple[Tenant, bool]:
        """Enable or disable a tenant; also whether that changed anything."""
        tenant, changed = await self.apply_tenant_update(name, enabled=enabled)
        return tenant, bool(changed)

    async def create_key(self, *, tenant: str, name: str | None = None, allowed_models: list[str] | None = None,
                         rpm: int | None = None) -> tuple[ApiKey, NewKey]:
        body = validated(KeyCreate, {"name": name, "allowed_models": allowed_models, "rpm": rpm})
        owner = await self.tenant(tenant)
        row, new = await tenancy.create_api_key(self.session, tenant_id=owner.id, name=body.name,
                                                allowed_models=body.allowed_models, rpm=body.rpm)
        await self._refuse_if_deleted(owner.id, tenant)  # no live key for a tenant deleted meanwhile
        await self.session.refresh(row)
        audit.record(self.session, actor=self.actor, action="key.create", target=f"key:{row.prefix}",
                     after=key_view(row, owner.name))
        await self.session.commit()
        return row, new

    async def revoke_key(self, ref: int | str) -> ApiKey:
        return (await self.apply_revoke(ref))[0]

    async def apply_revoke(self, ref: int | str) -> tuple[ApiKey, bool]:
        """Revoke a key; also whether this call revoked it. Revoking a revoked key changes nothing
        (no audit row, no push), also when several admins revoke it at once: one of them revokes
        it, the others find it revoked."""
        row = await self.key(ref)
        if row.revoked:
            return row, False
        owner = await self.owner(row)
        before = key_view(row, owner)
        revoked = await tenancy.revoke_active_key(self.session, key_id=row.id)
        await self.session.refresh(row)
        if not revoked:  # revoked by someone else since we read it
            await self.session.commit()  # ends the (empty) transaction; a rollback would expire ``row``
            return row, False
        audit.record(self.session, actor=self.actor, action="key.revoke", target=f"key:{row.prefix}",
                     before=before, after=key_view(row, owner))
        await self.session.commit()
        await self._invalidate(key_hash=row.key_hash)
        return row, True

    async def rotate_key(self, ref: int | str) -> tuple[ApiKey, ApiKey, NewKey]:
        """Revoke a key and mint its replacement (same tenant, name, models, rpm) in one commit."""
        old = await self.key(ref)
        owner = await self.owner(old)
        before = key_view(old, owner)
        # the conditional UPDATE decides between concurrent rotations: one wins, the others get 409
        if old.revoked or not await tenancy.revoke_active_key(self.session, key_id=old.id):
            conflict = Conflict(f"Key {old.prefix} is already revoked; create a new one instead.")
            await self.session.rollback()
            raise conflict
        await self.session.refresh(old)
        row, new = await tenancy.create_api_key(self.session, tenant_id=old.tenant_id, name=old.name,
                                                allowed_models=old.allowed_models, rpm=old.rpm_limit)
        await self._refuse_if_deleted(old.tenant_id, owner)
        await self.session.refresh(row)
        audit.record(self.session, actor=self.actor, action="key.rotate", target=f"key:{old.prefix}",
                     before=before, after={"revoked": key_view(old, owner), "replacement": key_view(row, owner)})
        # the replacement's own entry, so that its history starts with it (found by QA: `audit --target
        # key:<its prefix>` was empty)
        audit.record(self.session, actor=self.actor, action="key.create", target=f"key:{row.prefix}",
                     after={**key_view(row, owner), "replaces": old.prefix})
        await self.session.commit()
        await self._invalidate(key_hash=old.key_hash)
        return old, row, new

    async def set_price(self, *, model: str, prompt_usd_per_1m: Decimal | float | str,
                        completion_usd_per_1m: Decimal | float | str,
                        cached_prompt_usd_per_1m: Decimal | float | str | None = None) -> ModelPrice:
        return (await self.apply_price(model=model, prompt_usd_per_1m=prompt_usd_per_1m,
                                       completion_usd_per_1m=completion_usd_per_1m,
                                       cached_prompt_usd_per_1m=cached_prompt_usd_per_1m))[0]

    async def apply_price(self, *, model: str, prompt_usd_per_1m: Decimal | float | str,
                          completion_usd_per_1m: Decimal | float | str,
                          cached_prompt_usd_per_1m: Decimal | float | str | None = None) -> tuple[ModelPrice, bool]:
        """Set a model's price, the whole of it (a cached-prompt price left out is unset: cached
        tokens then cost what other prompt tokens do); also whether it changed (the price it has:
        no audit row)."""
        price = checked_price(self._dialect(), model=model, prompt_usd_per_1m=prompt_usd_per_1m,
                              completion_usd_per_1m=completion_usd_per_1m,
                              cached_prompt_usd_per_1m=cached_prompt_usd_per_1m)
        wanted = (price.prompt_usd_per_1m, price.completion_usd_per_1m, price.cached_prompt_usd_per_1m)
        for attempt in range(3):
            locked = await self._lock_price(model)  # (found by QA: concurrent changes each read the same "before")
            existing = await self.session.get(ModelPrice, model, populate_existing=True)
            if existing is not None and not locked:
                # inserted by another admin between the lock and the read: read unlocked, its "before"
                # could be overtaken (seen under load: a chain of 10 concurrent PUTs broke once); it
                # exists now, so lock it and read it again
                await self._lock_price(model)
                existing = await self.session.get(ModelPrice, model, populate_existing=True)
            if existing is not None and (existing.prompt_usd_per_1m, existing.completion_usd_per_1m,
                                         existing.cached_prompt_usd_per_1m) == wanted:
                return existing, False  # the price it has: nothing to record
            before = price_view(existing) if existing is not None else None
            try:
                # written as read: an insert when there was no row (another admin's meanwhile makes it
                # an IntegrityError, retried), else the row locked above (``tenancy.set_price`` would read
                # again, and update a row this "before" never saw)
                row = existing or ModelPrice(model=model)
                row.prompt_usd_per_1m, row.completion_usd_per_1m, row.cached_prompt_usd_per_1m = wanted
                self.session.add(row)
                await self.session.flush()
                await self.session.refresh(row)
                audit.record(self.session, actor=self.actor, action="price.set", target=f"model:{model}",
                             before=before, after=price_view(row))
                await self.session.commit()
                return row, True
            # a first price for the model inserted and committed by another admin between our read and
            # our insert (found by QA: concurrent PUTs of a new model's price were 500s): read it, update
            except IntegrityError as exc:
                await self.session.rollback()
                if attempt == 2:
                    raise Conflict(f"The price of {model!r} is being changed concurrently; try again.") from exc
        raise AssertionError("unreachable")

    async def delete_price(self, model: str) -> ModelPrice:
        """Remove a model's price (a mistyped model's, found by QA: one stayed listed for ever): the
        model then costs 0, as a model without a price does; rows already billed keep their cost.
        ``NotFound`` when it has none. One ``price.delete`` audit row."""
        await self._lock_price(model)
        row = await self.session.get(ModelPrice, model, populate_existing=True)
        if row is None:
            await self.session.rollback()
            raise NotFound(f"No price for model {cut_name(model)!r}.")
        before = price_view(row)
        await self.session.delete(row)
        audit.record(self.session, actor=self.actor, action="price.delete", target=f"model:{model}", before=before)
        await self.session.commit()
        return row

    async def _lock_price(self, model: str) -> bool:
        """Hold the model's price row (when it exists) until this change commits, so the price it
        reads as ``before`` is the one it replaces: PostgreSQL's row lock; SQLite's write lock, taken
        by a write that changes nothing. A first price has no row to lock: a race to insert it ends
        in the IntegrityError retry, which then reads the winner's row under the lock. Returns
        whether the row, if it exists now, is held (False: PostgreSQL found no row to lock)."""
        if self._dialect() == "postgresql":
            found = await self.session.execute(
                select(ModelPrice.model).where(ModelPrice.model == model).with_for_update())
            return found.first() is not None
        await self.session.execute(update(ModelPrice).where(ModelPrice.model == model)
                                   .values(updated_at=ModelPrice.updated_at))  # (its own value: no onupdate)
        return True

    def _dialect(self) -> str:
        return self.session.get_bind().dialect.name

    async def _refuse_if_deleted(self, tenant_id: int, name: str) -> None:
        """After a change's writes, before its commit: undo it (404) if the tenant was deleted
        meanwhile. Read after our own write, so a delete either committed first (and is seen
        here: SQLite's write lock, PostgreSQL's row lock taken by FOR SHARE, which waits for a
        delete in flight) or waits for this change to commit (and then revokes its key)."""
        deleted = await self.session.scalar(
            select(Tenant.deleted_at).where(Tenant.id == tenant_id).with_for_update(read=True))
        if deleted is not None:
            await self.session.rollback()
            raise NotFound(f"No tenant named {cut_name(name)!r}.")

    async def _forget_counter(self, tenant_id: int, period: str) -> None:
        """A new budget period: its counter in Redis, if one is left from an earlier time in that
        period, missed what was spent meanwhile; the gateways rebuild it from the usage rows."""
        if self.redis is None:
            self.counter_kept = True
            return
        try:
            await forget_counter(self.redis, self.redis_prefix, tenant_id, period)
        except RedisError as exc:
            self.invalidation_failed = self.counter_kept = True
            log.warning("budget period changed but its counter in Redis could not be dropped (%s): the "
                        "budget may count too little until the period ends", exc)

    async def _invalidate(self, *, key_hash: str | None = None, tenant_id: int | None = None) -> None:
        """Push the change to running gateways. The change is already committed: if Redis is down
        it is not undone; gateways then see it when their key cache expires (``key_cache_ttl_s``)."""
        if self.redis is None:
            return
        try:
            heard = await tenancy.publish_invalidation(self.redis, self.redis_prefix, key_hash=key_hash,
                                                       tenant_id=tenant_id)
            self.invalidation_unheard = self.invalidation_unheard or heard == 0
        except RedisError as exc:
            self.invalidation_failed = True
            log.warning("change saved but the Redis invalidation failed (%s); gateways pick it up when "
                        "their key cache expires", exc)


def _key_query(*, tenant: Tenant | None, prefix: str | None, include_revoked: bool) -> Select:
    query = select(ApiKey, Tenant.name).join(Tenant, ApiKey.tenant_id == Tenant.id)
    if tenant is not None:
        query = query.where(ApiKey.tenant_id == tenant.id)
    if prefix:
        query = query.where(ApiKey.prefix.startswith(prefix, autoescape=True))
    if not include_revoked:
        query = query.where(ApiKey.revoked.is_(False))
    return query
