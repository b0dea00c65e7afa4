"""``/admin/v1/tenants/{name}/report`` and ``/admin/v1/summary``: usage and cost over a UTC range
(default: the last 30 days), JSON or ``?format=csv``."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Response

from admin import reports
from admin.api.deps import ReadDep
from admin.api.routing import bad_request
from admin.schemas import InvalidField


def _reply(report: reports.Report, fmt: str, filename: str) -> Response | dict:
    if fmt == "csv":
        return Response(reports.to_csv(report), media_type="text/csv; charset=utf-8",
                        headers={"content-disposition": f'attachment; filename="{filename}.csv"'})
    return report.as_dict()


def _time(value: str | None, param: str) -> datetime | None:
    """``since``/``until`` read by ``reports.parse_time``, as the CLI reads them (not pydantic's
    datetime, which takes a bare number as Unix seconds)."""
    try:
        return None if value is None else reports.parse_time(value)
    except InvalidField as exc:
        raise bad_request(f"{param}: {exc}", param) from exc


def _range(since: str | None, until: str | None) -> tuple[datetime, datetime]:
    sent_since = since is not None
    since, until = reports.default_range(_time(since, "since"), _time(until, "until"))
    if since >= until:  # the bound the caller sent is the one at fault (found by QA: `until` alone, too early,
        # was blamed on the `since` it had not sent)
        raise bad_request(f"'since' ({since.isoformat()}) must be before 'until' ({until.isoformat()}).",
                          "since" if sent_since else "until")
    return since, until


def add_routes(router: APIRouter) -> None:
    @router.get("/tenants/{name}/report", response_model=None)
    async def tenant_report(name: str, ops: ReadDep, since: str | None = None, until: str | None = None,
                            group_by: Literal["day", "model", "key"] = "day",
                            format: Literal["json", "csv"] = "json") -> Response | dict:
        since, until = _range(since, until)
        tenant = await ops.tenant(name, include_deleted=True)  # a deleted tenant's usage is still billed
        report = await reports.tenant_report(ops.session, tenant=tenant, since=since, until=until,
                                             group_by=group_by)
        return _reply(report, format, f"{name}-by-{group_by}")

    @router.get("/summary", response_model=None)
    async def summary(ops: ReadDep, since: str | None = None, until: str | None = None,
                      format: Literal["json", "csv"] = "json") -> Response | dict:
        since, until = _range(since, until)
        return _reply(await reports.summary(ops.session, since=since, until=until), format, "summary")
