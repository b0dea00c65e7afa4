"""``/admin/v1/tenants``: create, list (a page by id), get, update limits / budget / cache settings,
disable and enable, clear the semantic cache, and the tenant's keys (a page by id)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from admin.api.deps import PageDep, ReadDep, WriteBareDep, WriteDep
from admin.management import key_view, tenant_view
from admin.schemas import BudgetUpdate, KeyCreate, TenantCreate, TenantLimits


def add_routes(router: APIRouter) -> None:
    @router.get("/tenants")
    async def list_tenants(ops: ReadDep, page: PageDep) -> dict:
        return (await ops.tenant_page(limit=page.limit, after=page.after)).as_dict()

    @router.post("/tenants", status_code=201)
    async def create_tenant(body: TenantCreate, ops: WriteDep) -> dict:
        fields = body.changes()
        fields.pop("name")
        return tenant_view(await ops.create_tenant(name=body.name, **fields))

    @router.get("/tenants/{name}")
    async def get_tenant(name: str, ops: ReadDep) -> dict:
        return tenant_view(await ops.tenant(name))

    @router.patch("/tenants/{name}")
    async def update_tenant(name: str, body: TenantLimits, ops: WriteDep) -> dict:
        return tenant_view(await ops.update_tenant(name, **body.changes()))

    @router.delete("/tenants/{name}")
    async def delete_tenant(name: str, ops: WriteBareDep) -> dict:
        tenant, revoked = await ops.delete_tenant(name)
        return {**tenant_view(tenant), "deleted": True, "keys_revoked": revoked}

    @router.delete("/tenants/{name}/cache")
    async def clear_tenant_cache(name: str, ops: WriteBareDep) -> dict:
        tenant, entries, gone = await ops.clear_cache(name)
        return {"tenant": tenant.name, "cache_cleared": True, "answers_removed": entries, "redis_keys_removed": gone}

    @router.post("/tenants/{name}/disable")
    async def disable_tenant(name: str, ops: WriteBareDep) -> dict:
        return tenant_view(await ops.set_enabled(name, False))

    @router.post("/tenants/{name}/enable")
    async def enable_tenant(name: str, ops: WriteBareDep) -> dict:
        return tenant_view(await ops.set_enabled(name, True))

    @router.get("/tenants/{name}/budget")
    async def get_budget(name: str, ops: ReadDep) -> dict:
        return await ops.budget(await ops.tenant(name, include_deleted=True))

    @router.put("/tenants/{name}/budget")
    async def set_budget(name: str, body: BudgetUpdate, ops: WriteDep) -> dict:
        changes = body.model_dump()
        if changes["period"] is None:
            del changes["period"]
        return await ops.budget(await ops.update_tenant(name, **changes))

    @router.get("/tenants/{name}/keys")
    async def list_tenant_keys(name: str, ops: ReadDep, page: PageDep) -> dict:
        tenant = await ops.tenant(name, include_deleted=True)
        return (await ops.key_page(tenant=tenant, limit=page.limit, after=page.after)).as_dict()

    @router.post("/tenants/{name}/keys", status_code=201)
    async def create_key(name: str, ops: WriteDep, body: Annotated[KeyCreate | None, Body()] = None) -> dict:
        body = body or KeyCreate()  # every field is optional: no body is {} (found by QA: it was a 400)
        row, new = await ops.create_key(tenant=name, name=body.name, allowed_models=body.allowed_models,
                                        rpm=body.rpm)
        return {**key_view(row, name), "key": new.key}
