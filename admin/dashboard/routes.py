"""Dashboard pages under ``/admin``: sign in, tenants (list + create), tenant detail (usage charts,
limits, keys: create shown once, revoke). Server-rendered Jinja2; POSTs answer 303 redirects,
except key creation, which renders the page with the new key (never put in a URL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from admin import reports
from admin.api.deps import ContextDep, SessionDep
from admin.api.routing import admin_route_class
from admin.auth import LEEWAY_S, MAX_TOKEN_TTL_S
from admin.context import AdminContext
from admin.dashboard.charts import Series, bar_chart, count, usd
from admin.dashboard.session import COOKIE, EditorDep, Viewer, ViewerDep, same_origin, url_parts
from admin.management import Management, tenant_view
from admin.schemas import (
    PLAIN_DECIMAL,
    PLAIN_DECIMAL_RULE,
    WHOLE_NUMBER,
    WHOLE_NUMBER_RULE,
    InvalidField,
    TenantCreate,
    TenantLimits,
    split_models,
    validated,
)
from gateway.db.models import Tenant
from gateway.errors import ApiError

ROOT = "/admin"
HERE = Path(__file__).parent
CSS = (HERE / "static" / "admin.css").read_text()
DEFAULT_DAYS = 30
# name=value of the sign-in cookie, at most: browsers keep 4,096 bytes of a cookie, its attributes
# counted in some (RFC 6265 6.1 asks for no more), and drop a longer one
MAX_COOKIE_BYTES = 3900


def _money(value: float | Decimal | None) -> str:
    return usd(value or 0)


def _field(value: Decimal | None) -> str:
    """Money as a form field's value: plain digits, as the form takes them back (found by QA: a $0
    budget read ``0E-8``, which the form's own save then refused)."""
    if value is None:
        return ""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _limit(value: int | None) -> str:
    """A tenant's rpm/tpm: null is the server default, 0 no limit."""
    if value is None:
        return "default"
    return f"{value:,}" if value else "unlimited"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f} ms"


def _budget_text(t: dict) -> str:
    parts = []
    if t.get("budget_tokens") is not None:
        parts.append(f"{t['budget_tokens']:,} tokens")
    if t.get("budget_usd") is not None:
        parts.append(_money(t["budget_usd"]))
    return f"{' + '.join(parts)} per {t['period']}" if parts else "none"


_env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
_env.globals.update(root=ROOT, money=_money, field=_field, ms=_ms, budget_text=_budget_text, limit=_limit)


# every page: never cached, never framed by another site (clickjacking; the SameSite cookie already
# stays out of a cross-site frame, this says so to the browser too), its type not sniffed; and, as
# the pages use no script and nothing from elsewhere, a policy that lets them load nothing else: a
# slip in escaping could not run a script, load a resource or send a form elsewhere
CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; "
       "frame-ancestors 'none'")
PAGE_HEADERS = {"cache-control": "no-store", "x-frame-options": "DENY", "content-security-policy": CSP,
                "x-content-type-options": "nosniff", "referrer-policy": "same-origin"}


def page(name: str, *, status: int = 200, **values: object) -> HTMLResponse:
    html = _env.get_template(name).render(**values)
    return HTMLResponse(html, status_code=status, headers=PAGE_HEADERS)


_REASONS = {400: "Bad request", 403: "Not allowed", 404: "Not found", 409: "Conflict",
            500: "Server error", 503: "Unavailable"}


def _same_site_referer(request: Request) -> str | None:
    """The page to go back to, only when it is on this server (never a link to another site) and
    a web page (found by QA: ``javascript://<this host>/%0a...`` has this server's host too)."""
    referer = request.headers.get("referer")
    parts = url_parts(referer) if referer else None
    if parts is not None and parts.scheme in ("http", "https") and parts.netloc == request.url.netloc:
        return referer
    return None


def _render_error(request: Request, err: ApiError) -> Response:
    if err.status == 401:
        resp = RedirectResponse(f"{ROOT}/login", status_code=303)
        if request.cookies.get(COOKIE):
            resp.delete_cookie(COOKIE, path=ROOT)
        return resp
    return page("error.html", status=err.status, code=err.status, reason=_REASONS.get(err.status, "Error"),
                message=err.message, viewer=None, back=_same_site_referer(request))


def _ops(ctx: AdminContext, session, viewer: Viewer) -> Management:
    return Management(session=session, actor=viewer.principal.subject, redis=ctx.redis,
                      redis_prefix=ctx.settings.redis_prefix)


def _blank(value: str | None) -> str | None:
    return None if value is None or not value.strip() else value.strip()


# the form's number fields, plain as the CLI's options are (pydantic's text conversion also takes
# "1_000" and "5.0" for a count)
_WHOLE_FIELDS = frozenset({"rpm", "tpm", "budget_tokens", "cache_ttl_s", "cache_max_entries"})
_MONEY_FIELDS = frozenset({"budget_usd"})
_DEFAULTED_FIELDS = frozenset({"rpm", "tpm"})  # blank: the server's default (their placeholder says "default")


def _form_fields(model: type[TenantLimits], **raw: str | None) -> TenantLimits:
    """The form's non-blank fields checked by ``model`` (``InvalidField`` on the first bad one)."""
    fields = {k: v for k, v in ((k, _blank(v)) for k, v in raw.items()) if v is not None}
    for name, value in fields.items():
        if name in _WHOLE_FIELDS and not WHOLE_NUMBER.fullmatch(value):
            blank = " (leave it empty for the server default)" if name in _DEFAULTED_FIELDS else ""
            raise InvalidField(f"{name}: {WHOLE_NUMBER_RULE}{blank}", name)
        if name in _MONEY_FIELDS and not PLAIN_DECIMAL.fullmatch(value):
            raise InvalidField(f"{name}: {PLAIN_DECIMAL_RULE}", name)
    return validated(model, fields)


def _to_tenant_page(name: str) -> RedirectResponse:
    return RedirectResponse(f"{ROOT}/tenants/{quote(name, safe='')}", status_code=303)


async def _tenant_page(ops: Management, viewer: Viewer, name: str, days: int, new_key: str | None = None,
                       notice: str | None = None):
    tenant = await ops.tenant(name, include_deleted=True)  # read-only for a deleted one: its usage stays
    since, until = reports.calendar_days(days)  # the tenant list's range too: one set of rows
    report = await reports.tenant_report(ops.session, tenant=tenant, since=since, until=until, group_by="day")
    by_day = {r.group: r for r in report.rows}
    day_names = [(since + timedelta(days=i)).strftime("%Y-%m-%d") for i in range(days)]

    def values(field: str) -> list[float]:
        return [float(getattr(by_day[d], field)) if d in by_day else 0.0 for d in day_names]

    charts = [
        bar_chart(Series("chart-cost", "Daily cost (USD)", day_names, values("cost_usd"), usd)),
        bar_chart(Series("chart-tokens", "Daily tokens", day_names, values("total_tokens"), count, "#7a5cc7")),
        bar_chart(Series("chart-savings", "Saved by the semantic cache (USD)", day_names, values("saved_usd"),
                         usd, "#1e8449")),
    ]
    keys = (await ops.key_page(tenant=tenant, limit=None)).data
    return page("tenant.html", viewer=viewer, tenant=tenant_view(tenant), report=report, charts=charts,
                keys=keys, budget=await ops.budget(tenant), days=days, new_key=new_key, notice=notice)


def add_routes(router: APIRouter) -> None:
    @router.get("", include_in_schema=False)
    @router.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse(f"{ROOT}/tenants", status_code=303)

    @router.get("/static/admin.css", include_in_schema=False)
    async def stylesheet() -> Response:
        return Response(CSS, media_type="text/css", headers={"cache-control": "max-age=300",
                                                             "x-content-type-options": "nosniff"})

    @router.get("/login", include_in_schema=False)
    async def login_form() -> HTMLResponse:
        return page("login.html", viewer=None, message=None)

    @router.post("/login", include_in_schema=False)
    async def login(request: Request, ctx: ContextDep, token: Annotated[str, Form()] = "") -> Response:
        same_origin(request)
        token = token.strip()
        try:
            principal = await ctx.verifier.verify(token)
            if not principal.has("admin:read"):
                raise ApiError(403, "This token has neither admin:read nor admin:write.", "permission_error")
        except ApiError as err:
            return page("login.html", status=err.status, viewer=None, message=err.message)
        if len(COOKIE) + 1 + len(token) > MAX_COOKIE_BYTES:  # (a JWT is ASCII: characters are bytes)
            # found by QA: a 5.4 KB token got its cookie, which the browser dropped without a word
            return page("login.html", status=400, viewer=None, message=(
                f"This token is {len(token):,} bytes; a browser keeps a sign-in cookie of at most about 4 KB, "
                "so the dashboard cannot hold it. Sign in with a shorter token (fewer claims); the admin API "
                "takes this one as it is."))
        resp = RedirectResponse(f"{ROOT}/tenants", status_code=303)
        # the cookie lives as long as the API takes the token (exp plus the clock-skew leeway: a token
        # just past exp signs in for those seconds), and never past the longest lifetime minted
        left = principal.claims["exp"] + LEEWAY_S - datetime.now(UTC).timestamp()
        max_age = min(max(int(left), 1), MAX_TOKEN_TTL_S)
        resp.set_cookie(COOKIE, token, max_age=max_age, path=ROOT, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
        return resp

    @router.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> RedirectResponse:
        same_origin(request)
        resp = RedirectResponse(f"{ROOT}/login", status_code=303)
        resp.delete_cookie(COOKIE, path=ROOT)
        return resp

    @router.get("/tenants", include_in_schema=False)
    async def tenants(viewer: ViewerDep, ctx: ContextDep, session: SessionDep) -> HTMLResponse:
        ops = _ops(ctx, session, viewer)
        # the tenant page's range (UTC calendar days, today included), so a tenant's figures here
        # are the ones its page shows
        since, until = reports.calendar_days(DEFAULT_DAYS)
        report = await reports.summary(session, since=since, until=until, percentiles=False)
        usage = {r.group: r for r in report.rows}
        tenants = [tenant_view(t) for t in await ops.tenants()]
        live = {t["name"] for t in tenants}
        # deleted tenants' spend in the range, and the total, so the page adds up to `summary`
        # (found by QA: a deleted tenant's cost left the page without a word)
        deleted = [r for r in report.rows if r.group not in live]
        return page("tenants.html", viewer=viewer, tenants=tenants, usage=usage, deleted=deleted,
                    total=report.total, days=DEFAULT_DAYS)

    @router.post("/tenants", include_in_schema=False)
    async def create_tenant(viewer: EditorDep, ctx: ContextDep, session: SessionDep,
                            name: Annotated[str, Form()], rpm: Annotated[str, Form()] = "",
                            tpm: Annotated[str, Form()] = "", budget_tokens: Annotated[str, Form()] = "",
                            budget_usd: Annotated[str, Form()] = "",
                            period: Annotated[str, Form()] = "month") -> RedirectResponse:
        body = _form_fields(TenantCreate, name=name, rpm=rpm, tpm=tpm, budget_tokens=budget_tokens,
                            budget_usd=budget_usd, period=period)
        fields = body.changes()
        fields.pop("name")
        tenant = await _ops(ctx, session, viewer).create_tenant(name=body.name, **fields)
        return _to_tenant_page(tenant.name)

    @router.get("/tenants/{name}", include_in_schema=False)
    async def tenant_detail(name: str, viewer: ViewerDep, ctx: ContextDep, session: SessionDep,
                            days: int = DEFAULT_DAYS) -> HTMLResponse:
        return await _tenant_page(_ops(ctx, session, viewer), viewer, name, min(max(days, 1), 366))

    @router.post("/tenants/{name}/limits", include_in_schema=False)
    async def update_limits(name: str, viewer: EditorDep, ctx: ContextDep, session: SessionDep,
                            rpm: Annotated[str, Form()] = "", tpm: Annotated[str, Form()] = "",
                            budget_tokens: Annotated[str, Form()] = "", budget_usd: Annotated[str, Form()] = "",
                            period: Annotated[str, Form()] = "month",
                            cache_enabled: Annotated[str, Form()] = "on") -> RedirectResponse:
        body = _form_fields(TenantLimits, period=period)
        changes = body.changes()
        # an emptied field clears the limit (null: server default / no budget)
        limits = _form_fields(TenantLimits, rpm=rpm, tpm=tpm, budget_tokens=budget_tokens, budget_usd=budget_usd)
        for field in ("rpm", "tpm", "budget_tokens", "budget_usd"):
            changes[field] = getattr(limits, field)
        if cache_enabled not in ("on", "off"):  # (the form's select sends one of these)
            raise InvalidField("cache_enabled: on or off", "cache_enabled")
        changes["cache_enabled"] = cache_enabled == "on"
        await _ops(ctx, session, viewer).update_tenant(name, **changes)
        return _to_tenant_page(name)

    for verb in ("enable", "disable"):
        def make(enabled: bool):
            async def toggle(name: str, viewer: EditorDep, ctx: ContextDep, session: SessionDep) -> RedirectResponse:
                await _ops(ctx, session, viewer).set_enabled(name, enabled)
                return _to_tenant_page(name)
            return toggle

        router.add_api_route(f"/tenants/{{name}}/{verb}", make(verb == "enable"), methods=["POST"],
                             include_in_schema=False, name=f"dashboard_{verb}")

    @router.post("/tenants/{name}/clear-cache", include_in_schema=False)
    async def clear_cache(name: str, viewer: EditorDep, ctx: ContextDep, session: SessionDep) -> HTMLResponse:
        ops = _ops(ctx, session, viewer)
        tenant, answers, gone = await ops.clear_cache(name)
        # the page itself says what went (as a new key is shown): a redirect would say nothing
        done = (f"Semantic cache cleared: {answers} stored answer{'' if answers == 1 else 's'} removed "
                f"({gone} Redis key{'' if gone == 1 else 's'}).")
        return await _tenant_page(ops, viewer, tenant.name, DEFAULT_DAYS, notice=done)

    @router.post("/tenants/{name}/delete", include_in_schema=False)
    async def delete_tenant(name: str, viewer: EditorDep, ctx: ContextDep, session: SessionDep,
                            confirm: Annotated[str, Form()] = "") -> RedirectResponse:
        if confirm != name:  # no JavaScript confirm(): the name typed is the confirmation
            raise ApiError(400, "Type the tenant's name to delete it.", "invalid_request_error", "invalid_value",
                           "confirm")
        await _ops(ctx, session, viewer).delete_tenant(name)
        return RedirectResponse(f"{ROOT}/tenants", status_code=303)

    @router.post("/tenants/{name}/keys", include_in_schema=False)
    async def create_key(name: str, viewer: EditorDep, ctx: ContextDep, session: SessionDep,
                         key_name: Annotated[str, Form()] = "", models: Annotated[str, Form()] = "") -> HTMLResponse:
        ops = _ops(ctx, session, viewer)
        # blank (spaces at most): all models; any other character is a name's, refused if it is no
        # name (found by QA: a lone no-break space made a key for every model, which the API refuses)
        allowed = split_models(models) if models.strip(" \t\r\n") else None
        _, new = await ops.create_key(tenant=name, name=_blank(key_name), allowed_models=allowed)
        return await _tenant_page(ops, viewer, name, DEFAULT_DAYS, new_key=new.key)

    @router.post("/keys/{ref}/revoke", include_in_schema=False)
    async def revoke_key(ref: int, viewer: EditorDep, ctx: ContextDep, session: SessionDep) -> RedirectResponse:
        ops = _ops(ctx, session, viewer)
        row = await ops.revoke_key(ref)
        owner = await ops.session.get_one(Tenant, row.tenant_id)
        return _to_tenant_page(owner.name)


def build_dashboard_router(ctx: AdminContext) -> APIRouter:
    router = APIRouter(prefix=ROOT, route_class=admin_route_class(ctx, _render_error))
    add_routes(router)
    return router
