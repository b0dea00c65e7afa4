"""Cost and usage reports over ``usage_records``.

Counts and sums are SQL aggregates (``GROUP BY`` day, model, key or tenant) that run the same on
SQLite and PostgreSQL; money is summed exactly on both (``gateway.pricing.usd_sum``). p50/p95 latency use linear interpolation: PostgreSQL computes them in the
query with ``percentile_cont``; on SQLite (no such function) ``percentile`` below does the same
arithmetic over the range's latencies, so both databases give the same answers. Times are UTC; a range is ``since <= created_at < until``.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import String, case, func, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from admin.audit import money
from admin.schemas import InvalidField
from gateway.db.models import ApiKey, Tenant, UsageRecord
from gateway.errors import cut_name
from gateway.pricing import summed_usd, usd_sum
from gateway.tenancy import RESERVED_NAME

GROUPS = ("day", "model", "key")
CACHE_HIT_VALUES = ("hit", "semantic-hit")  # cache outcomes that count as hits
U = UsageRecord


@dataclass(slots=True)
class ReportRow:
    """One line of a report; ``group`` is a day (YYYY-MM-DD), model, key prefix or tenant name."""

    group: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    cache_hits: int = 0
    saved_usd: Decimal = Decimal(0)
    p50_latency_ms: float | None = None
    p95_latency_ms: float | None = None

    def as_dict(self) -> dict:
        """The row with money as exact 8-decimal Decimals (the API writes them as exact numbers)."""
        d = asdict(self)
        d["cost_usd"], d["saved_usd"] = money(self.cost_usd), money(self.saved_usd)
        return d


@dataclass(slots=True)
class Report:
    group_by: str
    since: datetime
    until: datetime
    rows: list[ReportRow]
    total: ReportRow
    tenant: str | None = None

    def as_dict(self) -> dict:
        return {"tenant": self.tenant, "group_by": self.group_by, "since": self.since.isoformat(),
                "until": self.until.isoformat(), "rows": [r.as_dict() for r in self.rows],
                "total": self.total.as_dict()}


# the shapes read: a date, extended or basic, then optionally a time to the hour, minute or second
# (a fraction only of the second) and an offset in hours and minutes. Python's ``fromisoformat``
# takes more and reads it wrong (found by QA): a fraction of the hour or minute (``T17.75``, which
# ISO reads as 17:45) as a fraction of a second, and an offset's seconds and fraction
_ISO_BOUND = re.compile(
    r"\d{4}(?:-\d{2}-\d{2}|\d{4})"
    r"(?:[T ](?:\d{2}(?::\d{2}(?::\d{2}(?:[.,](?P<ext>\d+))?)?)?|\d{2}(?:\d{2}(?:\d{2}(?:[.,](?P<basic>\d+))?)?)?)"
    r"(?:Z|[+-]\d{2}(?::?\d{2})?)?)?")
_BARE_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def parse_time(value: str) -> datetime:
    """A range bound as the API and the CLI read it: an ISO 8601 date or datetime, extended
    (``2026-03-01``, ``2026-03-01T12:00Z``) or basic (``20260301``, ``20260301T1200``); naive
    means UTC. A bare number is refused rather than read as Unix seconds: ``20261203`` is a date
    here, and the same digits must not mean 1970 to one surface and 2026 to another. A time with no
    UTC equivalent (``0001-01-01T00:00+05:00``) is refused here too, so both surfaces name the bound
    (the API's 400 its ``param``, the CLI's usage error its option)."""
    bare = _BARE_NUMBER.fullmatch(value.strip()) is not None
    shape = _ISO_BOUND.fullmatch(value)
    if shape is None:
        if bare:
            raise _not_seconds(value)
        raise InvalidField(f"not an ISO date or datetime: {cut_name(value)!r} (e.g. 2026-03-01 or 2026-03-01T12:00Z; a "
                           "fraction only of the second, an offset in hours and minutes)")
    if (shape["ext"] or shape["basic"] or "")[6:].strip("0"):
        # ``fromisoformat`` cuts a fraction down to microseconds: an ``until`` would move earlier, and
        # rows on the wrong side of either bound be counted (found by QA)
        raise InvalidField(f"too precise: {cut_name(value)!r}; a time is kept to the microsecond (6 decimal places)")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        if bare:  # digits that are no date (20261345)
            raise _not_seconds(value) from exc
        raise InvalidField(f"not an ISO date or datetime: {cut_name(value)!r} (e.g. 2026-03-01 or "
                           "2026-03-01T12:00Z)") from exc
    _utc(parsed)
    return parsed


def _not_seconds(value: str) -> InvalidField:
    return InvalidField(f"not a date: {cut_name(value)!r}; use a date (2026-03-01 or 20260301) or an ISO "
                        "datetime (2026-03-01T12:00Z), not Unix seconds")


def default_range(since: datetime | None, until: datetime | None, *, days: int = 30) -> tuple[datetime, datetime]:
    """UTC ``[since, until)``; defaults to the last ``days`` days up to now."""
    until = _utc(until, "until") if until else datetime.now(UTC)
    if since is not None:
        return _utc(since, "since"), until
    earliest = datetime.min.replace(tzinfo=UTC)
    return (until - timedelta(days=days) if until - earliest > timedelta(days=days) else earliest), until


def calendar_days(days: int, now: datetime | None = None) -> tuple[datetime, datetime]:
    """UTC ``[since, until)`` of the last ``days`` calendar days, today included: from 00:00 of the
    day ``days - 1`` days ago to 00:00 tomorrow. The dashboard's ranges (its tenant list and a
    tenant's daily charts), so both pages count the same rows."""
    today = (now or datetime.now(UTC)).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=days - 1), today + timedelta(days=1)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linearly interpolated ``q``-quantile (0..1) of already sorted values."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


async def tenant_report(session: AsyncSession, *, tenant: Tenant, since: datetime, until: datetime,
                        group_by: str = "day") -> Report:
    """One tenant's usage in ``[since, until)`` grouped by ``day``, ``model`` or ``key``."""
    if group_by not in GROUPS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPS)}")
    dialect = (await session.connection()).dialect.name
    if group_by == "day":
        group_col, joins = _day(dialect), []
    elif group_by == "model":
        group_col, joins = U.model, []
    else:
        named = func.coalesce(literal(" ") + func.nullif(ApiKey.name, ""), "")  # no trailing space unnamed
        label = func.coalesce(ApiKey.prefix + named, "(no key)")
        group_col, joins = label, [ApiKey]
    where = [U.tenant_id == tenant.id, U.created_at >= _utc(since, "since"), U.created_at < _utc(until, "until")]
    report = await _run(session, group_col, joins, where, group_by, since, until)
    report.tenant = tenant.name
    return report


async def summary(session: AsyncSession, *, since: datetime, until: datetime,
                  percentiles: bool = True) -> Report:
    """Every tenant's usage in ``[since, until)``, one row per tenant with usage. Without
    ``percentiles`` the latency columns stay None and no per-row pass over the range is made."""
    where = [U.created_at >= _utc(since, "since"), U.created_at < _utc(until, "until")]
    return await _run(session, Tenant.name, [Tenant], where, "tenant", since, until, percentiles)


def _csv_cell(value: object) -> object:
    if value is None:
        return ""
    # money as fixed 8 decimals from the Decimal itself (str() would give "0E-8", a float "0.444")
    return format(value, "f") if isinstance(value, Decimal) else value


def to_csv(report: Report) -> str:
    """The report's rows and a final ``TOTAL`` row as CSV with a header line; money has 8 decimals."""
    names = [f.name for f in fields(ReportRow)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([report.group_by if n == "group" else n for n in names])
    for row in [*report.rows, report.total]:
        d = row.as_dict()
        writer.writerow([_csv_cell(d[n]) for n in names])
    return buf.getvalue()


def from_csv(text: str) -> list[dict]:
    """Parse ``to_csv`` output back into dicts with numbers, money as exact Decimals (for clients and
    tests)."""
    rows = []
    for raw in csv.DictReader(io.StringIO(text)):
        row = {}
        for key, value in raw.items():
            if value == "" or key in GROUPS or key in ("tenant", "group"):
                row[key] = value or None
            elif key.endswith("_usd"):
                row[key] = Decimal(value)
            elif key.endswith("_ms"):
                row[key] = float(value)
            else:
                row[key] = int(value)
        rows.append(row)
    return rows


def _utc(value: datetime, param: str | None = None) -> datetime:
    """``value`` in UTC (naive: already UTC); ``InvalidField`` naming ``param`` when it has none."""
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError as exc:  # e.g. 0001-01-01T00:00+05:00 has no UTC equivalent
        raise InvalidField(f"{value.isoformat()} is out of range (no UTC equivalent)", param) from exc


def _day(dialect: str):
    if dialect == "postgresql":
        return func.to_char(func.timezone("UTC", U.created_at), "YYYY-MM-DD")
    return func.strftime("%Y-%m-%d", U.created_at, type_=String)


def _measures(dialect: str) -> list:
    hit = case((U.cache.in_(CACHE_HIT_VALUES), 1), else_=0)
    return [
        func.count(U.id),
        func.coalesce(func.sum(U.prompt_tokens), 0),
        func.coalesce(func.sum(U.cached_prompt_tokens), 0),
        func.coalesce(func.sum(U.completion_tokens), 0),
        usd_sum(U.cost_usd, dialect),
        func.coalesce(func.sum(hit), 0),
        usd_sum(U.saved_usd, dialect),
    ]


def _row(group: str, values, p50: float | None, p95: float | None, *, dialect: str) -> ReportRow:
    n, prompt, cached, completion, cost, hits, saved = values
    return ReportRow(group=group, requests=int(n), prompt_tokens=int(prompt), cached_prompt_tokens=int(cached),
                     completion_tokens=int(completion), total_tokens=int(prompt) + int(completion),
                     cost_usd=_money(summed_usd(cost, dialect)), cache_hits=int(hits),
                     saved_usd=_money(summed_usd(saved, dialect)), p50_latency_ms=_round(p50),
                     p95_latency_ms=_round(p95))


def _quantiles(latencies: list[float]) -> tuple[float | None, float | None]:
    latencies.sort()
    return percentile(latencies, 0.50), percentile(latencies, 0.95)


async def _run(session: AsyncSession, group_col, joins: list, where: list, group_by: str,
               since: datetime, until: datetime, percentiles: bool = True) -> Report:
    """Grouped and total aggregates. Percentiles: PostgreSQL computes them in the query
    (``percentile_cont``, no rows leave the server); elsewhere one pass over the range's latencies."""
    def base(*cols):
        q = select(*cols).select_from(U)
        for target in joins:
            q = q.outerjoin(target, U.api_key_id == ApiKey.id) if target is ApiKey else q.join(
                target, U.tenant_id == Tenant.id)
        return q.where(*where)

    dialect = (await session.connection()).dialect.name
    in_sql = percentiles and dialect == "postgresql"
    measures = _measures(dialect)
    if in_sql:
        measures += [func.percentile_cont(q).within_group(U.latency_ms) for q in (0.50, 0.95)]
    grouped = (await session.execute(
        base(group_col.label("g"), *measures).group_by(group_col).order_by(group_col))).all()
    if in_sql:
        rows = [_row(str(r[0]), r[1:8], r[8], r[9], dialect=dialect) for r in grouped]
        p50, p95 = (await session.execute(base(*measures[7:]))).one() if rows else (None, None)
        return Report(group_by=group_by, since=_utc(since), until=_utc(until), rows=rows,
                      total=_total(rows, p50, p95))
    by_group: dict[str, list[float]] = defaultdict(list)
    everything: list[float] = []
    if percentiles:
        for g, latency in (await session.execute(base(group_col.label("g"), U.latency_ms))).all():
            by_group[str(g)].append(float(latency or 0.0))
            everything.append(float(latency or 0.0))
    rows = [_row(str(r[0]), r[1:], *_quantiles(by_group[str(r[0])]), dialect=dialect) for r in grouped]
    return Report(group_by=group_by, since=_utc(since), until=_utc(until), rows=rows,
                  total=_total(rows, *_quantiles(everything)))


def _total(rows: list[ReportRow], p50: float | None, p95: float | None) -> ReportRow:
    """The TOTAL line: the sums of the lines above it, so that it adds up exactly, also while usage
    rows are being written (found by QA: as a query of its own, it could count a row the grouped
    query, a statement earlier, had not seen: PostgreSQL at READ COMMITTED takes a snapshot per
    statement). Its latency percentiles (which do not add up) come from their own query."""
    total = ReportRow(group=RESERVED_NAME, p50_latency_ms=_round(p50), p95_latency_ms=_round(p95))
    for row in rows:
        for name in _SUMMED:
            setattr(total, name, getattr(total, name) + getattr(row, name))
    return total


_SUMMED = ("requests", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "total_tokens", "cost_usd",
           "cache_hits", "saved_usd")


def _money(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.00000001"))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
