"""``/admin/v1/audit`` (the audit log, newest first, a page at a time: ``after`` moves to older
entries) and ``/admin/v1/whoami``."""

from __future__ import annotations

from fastapi import APIRouter

from admin.api.deps import PageDep, ReadDep, ReaderDep


def add_routes(router: APIRouter) -> None:
    @router.get("/audit")
    async def list_audit(ops: ReadDep, page: PageDep, target: str | None = None, action: str | None = None) -> dict:
        return (await ops.audit_page(target=target, action=action, limit=page.limit, after=page.after)).as_dict()

    @router.get("/whoami")
    async def whoami(who: ReaderDep) -> dict:
        return {"sub": who.subject, "scopes": sorted(who.scopes), "exp": who.claims.get("exp")}
