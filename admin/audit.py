"""The admin audit log: every write through the admin API, CLI or dashboard adds one row —
who (the token's ``sub``, or ``cli:<user>``), what (``tenant.create``, ``key.revoke``, …), when,
and the target's state before and after as JSON (money as its exact decimal string, read back as a
Decimal so the API shows it as the same exact number as everywhere else)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gateway.db.models import AuditLog

MONEY_QUANTUM = Decimal("0.00000001")  # money's scale in the database: NUMERIC(18, 8)
# money fields of the views the audit log keeps (stored as exact strings: see ``storable``)
MONEY_FIELDS = frozenset({"budget_usd", "prompt_usd_per_1m", "completion_usd_per_1m", "cached_prompt_usd_per_1m"})


def money(value: Decimal) -> Decimal:
    """``value`` at money's 8 decimals (``0.5`` → ``0.50000000``)."""
    return value.quantize(MONEY_QUANTUM)


def timestamp(value: datetime) -> str:
    """A stored time as every admin view shows it: UTC, ISO 8601, whole seconds
    (``2026-12-03T16:02:59+00:00``). The database's own clock gives SQLite whole seconds and
    PostgreSQL microseconds, times set by pagegate (``revoked_at``, ``deleted_at``) carry
    microseconds: one precision for all, as the CLI's tables show them."""
    # SQLite hands back naive datetimes; everything pagegate stores is UTC.
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC).isoformat(timespec="seconds")


def jsonable(value: Any) -> Any:
    """Datetimes and nested containers made JSON-safe. A Decimal stays a Decimal, at 8 decimals: a
    float cannot hold 18 digits, and ``admin.api.exact_json`` writes it as the exact JSON number."""
    if isinstance(value, Decimal):
        return money(value)
    if isinstance(value, datetime):
        return timestamp(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def storable(value: Any) -> Any:
    """``jsonable`` with money as its exact decimal string: the JSON column's encoder has no Decimal."""
    value = jsonable(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dict):
        return {k: storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


def _money_back(value: Any) -> Any:
    """A stored snapshot with its money strings turned back into Decimals (numbers in the API)."""
    if isinstance(value, dict):
        return {k: Decimal(v) if k in MONEY_FIELDS and isinstance(v, str) else _money_back(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_money_back(v) for v in value]
    return value


def record(session: AsyncSession, *, actor: str, action: str, target: str,
           before: dict | None = None, after: dict | None = None, detail: str | None = None) -> AuditLog:
    """Add an audit row to ``session``; it commits with the change it describes."""
    row = AuditLog(actor=actor, action=action, target=target,
                   before=storable(before), after=storable(after), detail=detail)
    session.add(row)
    return row


def entry_view(row: AuditLog) -> dict:
    return {"id": row.id, "created_at": jsonable(row.created_at), "actor": row.actor, "action": row.action,
            "target": row.target, "before": _money_back(row.before), "after": _money_back(row.after),
            "detail": row.detail}
