"""``/admin/v1/audit`` (the audit log, newest first) and ``/admin/v1/whoami``."""

from __future__ import annotations

from fastapi import APIRouter, Query

from admin import audit
from admin.api.deps import ReadDep, ReaderDep


def add_routes(router: APIRouter) -> None:
    @router.get("/audit")
    async def list_audit(ops: ReadDep, target: str | None = None, action: str | None = None,
                         limit: int = Query(100, ge=1, le=1000)) -> dict:
        return {"object": "list",
                "data": await audit.list_entries(ops.session, target=target, action=action, limit=limit)}

    @router.get("/whoami")
    async def whoami(who: ReaderDep) -> dict:
        return {"sub": who.subject, "scopes": sorted(who.scopes), "exp": who.claims.get("exp")}
