"""The admin audit log: every write through the admin API, CLI or dashboard adds one row —
who (the token's ``sub``, or ``cli:<user>``), what (``tenant.create``, ``key.revoke``, …), when,
and the target's state before and after as JSON."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.db.models import AuditLog


def jsonable(value: Any) -> Any:
    """Decimals, datetimes and nested containers made JSON-safe (money keeps 8 decimals)."""
    if isinstance(value, Decimal):
        return float(round(value, 8))
    if isinstance(value, datetime):
        # SQLite hands back naive datetimes; everything pagegate stores is UTC.
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def record(session: AsyncSession, *, actor: str, action: str, target: str,
           before: dict | None = None, after: dict | None = None, detail: str | None = None) -> AuditLog:
    """Add an audit row to ``session``; it commits with the change it describes."""
    row = AuditLog(actor=actor[:128], action=action, target=target[:128],
                   before=jsonable(before), after=jsonable(after), detail=detail)
    session.add(row)
    return row


async def list_entries(session: AsyncSession, *, target: str | None = None, action: str | None = None,
                       limit: int = 100) -> list[dict]:
    query = select(AuditLog).order_by(AuditLog.id.desc()).limit(limit)
    if target:
        query = query.where(AuditLog.target == target)
    if action:
        query = query.where(AuditLog.action == action)
    rows = (await session.execute(query)).scalars().all()
    return [entry_view(r) for r in rows]


def entry_view(row: AuditLog) -> dict:
    return {"id": row.id, "created_at": jsonable(row.created_at), "actor": row.actor, "action": row.action,
            "target": row.target, "before": row.before, "after": row.after, "detail": row.detail}
