"""``/admin/v1/keys``: list (a page by id; by tenant and/or display prefix), get, revoke, rotate. A key is named
by its numeric id or its display prefix; the full key is only ever shown in a create/rotate reply."""

from __future__ import annotations

from fastapi import APIRouter

from admin.api.deps import PageDep, ReadDep, WriteBareDep
from admin.management import key_view


def add_routes(router: APIRouter) -> None:
    @router.get("/keys")
    async def list_keys(ops: ReadDep, page: PageDep, prefix: str | None = None, tenant: str | None = None,
                        include_revoked: bool = True) -> dict:
        owner = await ops.tenant(tenant, include_deleted=True) if tenant else None
        return (await ops.key_page(tenant=owner, prefix=prefix, include_revoked=include_revoked,
                                   limit=page.limit, after=page.after)).as_dict()

    @router.get("/keys/{ref}")
    async def get_key(ref: str, ops: ReadDep) -> dict:
        row = await ops.key(ref)
        return key_view(row, await ops.owner(row))

    @router.post("/keys/{ref}/revoke")
    async def revoke_key(ref: str, ops: WriteBareDep) -> dict:
        row = await ops.revoke_key(ref)
        return key_view(row, await ops.owner(row))

    @router.post("/keys/{ref}/rotate", status_code=201)
    async def rotate_key(ref: str, ops: WriteBareDep) -> dict:
        old, row, new = await ops.rotate_key(ref)
        owner = await ops.owner(row)
        return {**key_view(row, owner), "key": new.key, "replaces": key_view(old, owner)}
