"""Dashboard pages over HTTP (no browser): sign-in cookie, CSRF and origin checks, tenant and key
management, charts fed by usage rows."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest
from admin_testlib import unique, usage_row
from sqlalchemy import select

from admin.dashboard.session import COOKIE
from gateway.db.models import ApiKey, AuditLog, Tenant
from gateway.keys import hash_key


@pytest.fixture
async def browser_like(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin.test",
                                 follow_redirects=False) as c:
        yield c


async def _sign_in(c: httpx.AsyncClient, token: str) -> None:
    resp = await c.post("/admin/login", data={"token": token})
    assert resp.status_code == 303, resp.text
    assert resp.headers["location"] == "/admin/tenants"
    cookie = resp.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Path=/admin" in cookie


def _csrf(html: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)


async def test_signed_out_pages_redirect_to_login(browser_like):
    for path in ("/admin/tenants", "/admin/tenants/x", "/admin", "/admin/"):
        resp = await browser_like.get(path)
        assert resp.status_code == 303
        assert resp.headers["location"] in ("/admin/login", "/admin/tenants")
    resp = await browser_like.get("/admin/login")
    assert resp.status_code == 200 and 'name="token"' in resp.text
    resp = await browser_like.post("/admin/tenants", data={"name": "x", "csrf": "y"})
    assert resp.status_code == 303 and resp.headers["location"] == "/admin/login"


async def test_bad_token_sign_in_shows_message(browser_like, settings, token):
    resp = await browser_like.post("/admin/login", data={"token": "garbage"})
    assert resp.status_code == 401 and "malformed" in resp.text and COOKIE not in resp.headers.get("set-cookie", "")
    resp = await browser_like.post("/admin/login", data={"token": token(ttl_s=-100)})
    assert resp.status_code == 401 and "expired" in resp.text


async def test_manage_tenant_and_keys_through_pages(browser_like, app, token):
    c = browser_like
    await _sign_in(c, token(sub="dash-user"))
    page = await c.get("/admin/tenants")
    assert page.status_code == 200 and 'id="create-tenant"' in page.text
    csrf = _csrf(page.text)

    name = unique("dash")
    resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": name, "rpm": "30", "tpm": "",
                                                "budget_usd": "4.5", "period": "day"})
    assert resp.status_code == 303 and resp.headers["location"] == f"/admin/tenants/{name}"
    async with app.state.admin_context.database.sessionmaker() as s:
        tenant = await s.scalar(select(Tenant).where(Tenant.name == name))
        assert (tenant.rpm_limit, tenant.tpm_limit, float(tenant.budget_usd), tenant.budget_period) == (
            30, None, 4.5, "day")
        s.add(usage_row(tenant_id=tenant.id, key_id=None, model="m", when=datetime.now(UTC), prompt=100, cached=0,
                        completion=50, cost="0.25", saved="0.05", latency=120.0, cache="miss"))
        await s.commit()

    detail = await c.get(f"/admin/tenants/{name}")
    assert detail.status_code == 200
    for chart in ("chart-cost", "chart-tokens", "chart-savings"):
        assert f'id="{chart}"' in detail.text
    bars = re.findall(r'<rect class="bar" data-day="[^"]+" data-value="([0-9.e-]+)"', detail.text)
    assert len(bars) == 3 * 30 and max(float(v) for v in bars[:30]) == pytest.approx(0.25)
    assert 'id="stat-cost">$0.25<' in detail.text  # money with up to 8 decimals, at least cents

    resp = await c.post(f"/admin/tenants/{name}/keys", data={"csrf": csrf, "key_name": "x", "models": ","})
    assert resp.status_code == 400 and "allowed_models" in resp.text  # not silently "all models"
    resp = await c.post(f"/admin/tenants/{name}/keys", data={"csrf": csrf, "key_name": "web", "models": "a, b"})
    assert resp.status_code == 200
    key = re.search(r'<pre id="new-key">(pg-[0-9A-Za-z]+)</pre>', resp.text).group(1)
    async with app.state.admin_context.database.sessionmaker() as s:
        row = await s.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(key)))
        assert row.name == "web" and row.allowed_models == ["a", "b"]
    again = await c.get(f"/admin/tenants/{name}")
    assert key not in again.text and row.prefix in again.text  # shown once

    resp = await c.post(f"/admin/keys/{row.id}/revoke", data={"csrf": csrf})
    assert resp.status_code == 303
    async with app.state.admin_context.database.sessionmaker() as s:
        assert (await s.get(ApiKey, row.id)).revoked is True
        actors = (await s.execute(select(AuditLog.actor, AuditLog.action)
                                  .where(AuditLog.target.in_([f"tenant:{name}", f"key:{row.prefix}"])))).all()
        assert set(actors) == {("dash-user", "tenant.create"), ("dash-user", "key.create"),
                               ("dash-user", "key.revoke")}

    resp = await c.post(f"/admin/tenants/{name}/limits", data={"csrf": csrf, "rpm": "", "tpm": "900",
                                                               "budget_tokens": "", "budget_usd": "",
                                                               "period": "month", "cache_enabled": "off"})
    assert resp.status_code == 303
    resp = await c.post(f"/admin/tenants/{name}/disable", data={"csrf": csrf})
    assert resp.status_code == 303
    async with app.state.admin_context.database.sessionmaker() as s:
        t = await s.scalar(select(Tenant).where(Tenant.name == name))
        assert (t.rpm_limit, t.tpm_limit, t.budget_usd, t.budget_period, t.cache_enabled, t.enabled) == (
            None, 900, None, "month", False, False)

    resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": name})
    assert resp.status_code == 409 and "already exists" in resp.text
    resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": unique("x"), "rpm": "-3"})
    assert resp.status_code == 400
    # a crafted post's cache setting that is neither on nor off: refused, not read as off (a QA find)
    resp = await c.post(f"/admin/tenants/{name}/enable", data={"csrf": csrf})
    resp = await c.post(f"/admin/tenants/{name}/limits", data={"csrf": csrf, "period": "month", "cache_enabled": "maybe"})
    assert resp.status_code == 400 and "cache_enabled" in resp.text


async def test_csrf_and_origin_are_enforced(browser_like, token):
    c = browser_like
    await _sign_in(c, token())
    csrf = _csrf((await c.get("/admin/tenants")).text)
    name = unique("csrf")
    resp = await c.post("/admin/tenants", data={"csrf": "0" * 40, "name": name})
    assert resp.status_code == 403 and "form" in resp.text
    resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": name},
                        headers={"origin": "https://evil.example"})
    assert resp.status_code == 403
    # an opaque origin (a sandboxed frame, a data: page) is refused even with the right token
    resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": name}, headers={"origin": "null"})
    assert resp.status_code == 403 and "Cross-site" in resp.text
    # nor can an opaque origin sign a browser in with its own token (login CSRF)
    resp = await c.post("/admin/login", data={"token": token()}, headers={"origin": "null"})
    assert resp.status_code == 403 and "set-cookie" not in resp.headers
    # headers urlsplit cannot parse, and a token with non-ASCII characters: refused, not a 500 (QA)
    for header in ("origin", "referer"):
        resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": name}, headers={header: "http://[::1"})
        assert resp.status_code == 403 and "Cross-site" in resp.text, header
    c.cookies.clear()
    resp = await c.post("/admin/login", data={"token": token()}, headers={"origin": "http://[x"})
    assert resp.status_code == 403 and "set-cookie" not in resp.headers
    await _sign_in(c, token())
    csrf = _csrf((await c.get("/admin/tenants")).text)  # the new token's
    resp = await c.post("/admin/tenants", data={"csrf": "\u00e9" + csrf[1:], "name": name})
    assert resp.status_code == 403 and "form" in resp.text
    resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": name}, headers={"origin": "http://admin.test"})
    assert resp.status_code == 303


async def test_read_only_viewer_sees_no_forms_and_cannot_post(browser_like, token):
    c = browser_like
    await _sign_in(c, token("admin:read"))
    page = await c.get("/admin/tenants")
    assert page.status_code == 200 and 'id="create-tenant"' not in page.text and "read-only" in page.text
    csrf = _csrf(page.text)  # the sign-out form still carries one
    resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": unique("ro")})
    assert resp.status_code == 403 and "admin:write" in resp.text


async def test_logout_clears_cookie(browser_like, token):
    c = browser_like
    await _sign_in(c, token())
    resp = await c.post("/admin/logout")
    assert resp.status_code == 303 and f'{COOKIE}=""' in resp.headers["set-cookie"]
    c.cookies.clear()
    assert (await c.get("/admin/tenants")).status_code == 303


async def test_error_pages_say_what_went_wrong(browser_like, token):
    c = browser_like
    await _sign_in(c, token())
    csrf = _csrf((await c.get("/admin/tenants")).text)
    resp = await c.get("/admin/tenants/nobody-here", headers={"referer": "https://evil.example/x"})
    assert resp.status_code == 404
    assert "<h1>404 · Not found</h1>" in resp.text and "No tenant named" in resp.text
    assert "evil.example" not in resp.text  # the Back link never leads off this server
    # nor to a script with this server's host (found by QA)
    resp = await c.get("/admin/tenants/nobody-here",
                       headers={"referer": "javascript://admin.test/%0aalert(document.domain)"})
    assert resp.status_code == 404 and "javascript:" not in resp.text
    # a Referer urlsplit cannot parse: the error page without a Back link, not a 500 (found by QA)
    resp = await c.get("/admin/tenants/nobody-here", headers={"referer": "http://[admin.test/"})
    assert resp.status_code == 404 and "No tenant named" in resp.text and "[admin.test" not in resp.text
    # pages are never framed by another site, nor sniffed
    assert resp.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in resp.headers["content-security-policy"]
    assert resp.headers["x-content-type-options"] == "nosniff"
    resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": unique("big"), "rpm": str(2**31)},
                        headers={"referer": "http://admin.test/admin/tenants"})
    assert resp.status_code == 400 and "<h1>400 · Bad request</h1>" in resp.text
    assert "rpm: Input should be less than or equal to 2147483647" in resp.text
    assert 'href="http://admin.test/admin/tenants"' in resp.text
    for field, value in (("rpm", "1_000"), ("rpm", "5.0"), ("tpm", "+5"), ("budget_usd", "1e3"),
                         ("budget_usd", "1_000")):  # plain numbers, as the CLI and the API take them
        resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": unique("lax"), field: value})
        assert resp.status_code == 400 and f"{field}: must be a " in resp.text, (field, value)
    # the limits' placeholder is "default": the refusal of the word says how to get it
    resp = await c.post("/admin/tenants", data={"csrf": csrf, "name": unique("word"), "rpm": "default"})
    assert resp.status_code == 400 and "rpm: must be a whole number" in resp.text
    assert "leave it empty for the server default" in resp.text
    resp = await c.post("/admin/keys/99999999999999/revoke", data={"csrf": csrf})
    assert resp.status_code == 404 and "No API key" in resp.text


async def _signed_in_with_a_tenant(c, token, prefix: str) -> tuple[str, str]:  # noqa: ANN001
    """Sign in as an editor and create a tenant through the dashboard: (CSRF token, tenant name)."""
    await _sign_in(c, token(sub="dash-user"))
    csrf = _csrf((await c.get("/admin/tenants")).text)
    name = unique(prefix)
    assert (await c.post("/admin/tenants", data={"csrf": csrf, "name": name})).status_code == 303
    return csrf, name


async def test_delete_a_tenant_by_typing_its_name(browser_like, app, token):
    c = browser_like
    csrf, name = await _signed_in_with_a_tenant(c, token, "dashdel")
    page = await c.get(f"/admin/tenants/{name}")
    assert 'id="delete-tenant"' in page.text
    wrong = await c.post(f"/admin/tenants/{name}/delete", data={"csrf": csrf, "confirm": name.upper()})
    assert wrong.status_code == 400 and "Type the tenant" in wrong.text
    async with app.state.admin_context.database.sessionmaker() as s:
        tid = (await s.scalar(select(Tenant).where(Tenant.name == name))).id
        s.add(usage_row(tenant_id=tid, key_id=None, model="m", when=datetime.now(UTC), prompt=7, cached=0,
                        completion=3, cost="0.125", latency=10.0))
        await s.commit()
    done = await c.post(f"/admin/tenants/{name}/delete", data={"csrf": csrf, "confirm": name})
    assert done.status_code == 303 and done.headers["location"] == "/admin/tenants"
    # its spend stays on the list, marked deleted, and in the total (found by QA: it left the page,
    # which then disagreed with `summary` without a word)
    listed = (await c.get("/admin/tenants")).text
    row = re.search(r'<tr class="deleted">\s*<td><a href="/admin/tenants/' + re.escape(name) + r'">.*?</tr>', listed, re.S)
    assert row and ">deleted<" in row.group(0) and ">$0.125<" in row.group(0) and ">10<" in row.group(0), listed
    assert 'id="tenants-total"' in listed and "deleted tenants included" in listed
    assert 'id="create-tenant"' in listed
    gone = await c.get(f"/admin/tenants/{name}")  # its page stays, read-only, marked deleted
    assert gone.status_code == 200 and 'id="tenant-deleted"' in gone.text and 'id="delete-tenant"' not in gone.text
    again = await c.post(f"/admin/tenants/{name}/delete", data={"csrf": csrf, "confirm": name})
    assert again.status_code == 404
    async with app.state.admin_context.database.sessionmaker() as s:
        assert (await s.scalar(select(Tenant).where(Tenant.name == name))).deleted_at is not None


def _max_age(resp: httpx.Response) -> int:
    return int(re.search(r"Max-Age=(\d+)", resp.headers["set-cookie"]).group(1))


async def test_sign_in_cookie_lives_as_long_as_the_token_is_accepted(browser_like, settings, token):
    """A token a few seconds past exp is still inside the API's 30 s leeway: sign-in gives it a
    cookie for the rest of it (it was Max-Age=0, a silent bounce back to sign-in). A token with an
    absurd exp gets a cookie of one year at most (it was Max-Age=99999999998203691008)."""
    from admin_testlib import SECRET, sign

    from admin.auth import LEEWAY_S, MAX_TOKEN_TTL_S

    resp = await browser_like.post("/admin/login", data={"token": token(ttl_s=-5)})
    assert resp.status_code == 303 and 1 <= _max_age(resp) <= LEEWAY_S - 5
    assert (await browser_like.get("/admin/tenants")).status_code == 200  # and the pages take it
    resp = await browser_like.post("/admin/login", data={"token": token(ttl_s=600)})
    assert 595 <= _max_age(resp) <= 600 + LEEWAY_S
    forever = sign({"alg": "HS256"}, {"iss": settings.admin_jwt_issuer, "sub": "far", "exp": 1e20,
                                      "scope": "admin:read"}, SECRET.encode())
    resp = await browser_like.post("/admin/login", data={"token": forever})
    assert resp.status_code == 303 and _max_age(resp) == MAX_TOKEN_TTL_S


async def test_money_keeps_its_decimals_and_zero_limits_read_unlimited(browser_like, app, client, auth, token):
    from admin.dashboard.charts import usd

    assert [usd(v) for v in (0, 0.000015, Decimal("0.00219437"), Decimal("1234.5"))] == [
        "$0.00", "$0.000015", "$0.00219437", "$1,234.50"]
    name = unique("cheap")
    tid = (await client.post("/admin/v1/tenants", json={"name": name, "rpm": 0, "tpm": 1500},
                             headers=auth())).json()["id"]
    async with app.state.admin_context.database.sessionmaker() as s:
        s.add(usage_row(tenant_id=tid, key_id=None, model="m", when=datetime.now(UTC), prompt=3, cached=0,
                        completion=2, cost="0.00219437", latency=5.0))
        await s.commit()
    await _sign_in(browser_like, token())
    listing = (await browser_like.get("/admin/tenants")).text
    row = re.search(rf'<tr>\s*<td><a href="/admin/tenants/{name}">.*?</tr>', listing, re.S).group(0)
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert cells[:2] == ["unlimited", "1,500"] and "$0.00219437" in cells
    detail = (await browser_like.get(f"/admin/tenants/{name}")).text
    assert 'id="stat-cost">$0.00219437<' in detail and "RPM: unlimited · TPM: 1,500" in detail


async def test_the_tenant_list_and_the_tenant_page_count_the_same_30_days(browser_like, app, client, auth, token):
    """Found by QA: the tenant list summed a rolling now-30d..now while the tenant page summed 30 UTC
    calendar days (today-29d 00:00 .. tomorrow 00:00), so a row between the two starts (or one
    later today, by clock skew) was in one 30-day total and not in the other. Both now use the
    calendar days the page's daily charts show."""
    name = unique("window")
    tid = (await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())).json()["id"]
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    since, until = today - timedelta(days=29), today + timedelta(days=1)
    async with app.state.admin_context.database.sessionmaker() as s:
        for when, cost in ((since - timedelta(seconds=1), "0.25"),  # within now-30d, before the first day
                           (datetime.now(UTC), "1"), (until - timedelta(seconds=1), "0.5")):  # later today
            s.add(usage_row(tenant_id=tid, key_id=None, model="m", when=when, prompt=1, cached=0, completion=1,
                            cost=cost, latency=5.0))
        await s.commit()
    await _sign_in(browser_like, token())
    listing = (await browser_like.get("/admin/tenants")).text
    row = re.search(rf'<tr>\s*<td><a href="/admin/tenants/{name}">.*?</tr>', listing, re.S).group(0)
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert (cells[2], cells[4]) == ("2", "$1.50"), cells  # requests, cost
    detail = (await browser_like.get(f"/admin/tenants/{name}")).text
    assert 'id="stat-requests">2<' in detail and 'id="stat-cost">$1.50<' in detail


async def test_clear_a_tenants_semantic_cache(browser_like, app, token):
    c = browser_like
    csrf, name = await _signed_in_with_a_tenant(c, token, "dashclear")
    assert 'id="clear-cache"' in (await c.get(f"/admin/tenants/{name}")).text
    done = await c.post(f"/admin/tenants/{name}/clear-cache", data={"csrf": csrf})
    # the tenant's page, saying what went (a new tenant has nothing stored)
    assert done.status_code == 200 and 'id="tenant-name">' + name in done.text
    assert re.search(r'id="notice"><p>Semantic cache cleared: 0 stored answers removed \(0 Redis keys\)', done.text)
    assert 'id="notice"' not in (await c.get(f"/admin/tenants/{name}")).text  # said once
    async with app.state.admin_context.database.sessionmaker() as s:
        actions = (await s.scalars(select(AuditLog.action).where(AuditLog.target == f"tenant:{name}"))).all()
    assert "tenant.cache_clear" in actions
    assert (await c.post(f"/admin/tenants/{name}/clear-cache", data={})).status_code == 403  # no CSRF token


async def test_a_budget_under_a_cent_reads_as_plain_digits_and_its_form_saves(browser_like, client, auth, token):
    """Found by QA: a $0 budget filled the form with ``0E-8`` (a Decimal's str), which the form's own
    Save then refused as an exponent; so did $0.00000001 (``1E-8``)."""
    c = browser_like
    await _sign_in(c, token())
    for budget, shown in (("0", "0"), ("0.00000001", "0.00000001"), ("25", "25"), ("12.5", "12.5")):
        name = unique("zero")
        assert (await client.post("/admin/v1/tenants", json={"name": name, "budget_usd": budget},
                                  headers=auth())).status_code == 201
        html = (await c.get(f"/admin/tenants/{name}")).text
        assert re.search(rf'name="budget_usd" [^>]*value="{re.escape(shown)}"', html), (budget, html)
        resp = await c.post(f"/admin/tenants/{name}/limits", data={
            "csrf": _csrf(html), "rpm": "7", "tpm": "", "budget_tokens": "", "budget_usd": shown, "period": "month",
            "cache_enabled": "on"})
        assert resp.status_code == 303, resp.text
        got = (await client.get(f"/admin/v1/tenants/{name}", headers=auth())).json()
        assert got["rpm"] == 7 and Decimal(str(got["budget_usd"])) == Decimal(budget)


async def test_a_token_too_long_for_a_cookie_is_refused_at_sign_in(browser_like, settings):
    """Found by QA: a 5.4 KB token (an identity provider's, with group claims) got a cookie that
    browsers drop (over 4 KB), and the admin was back on the sign-in page without a word."""
    from admin_testlib import SECRET, sign

    claims = {"iss": settings.admin_jwt_issuer, "sub": "big", "scope": "admin:read",
              "exp": int(datetime.now(UTC).timestamp()) + 600, "groups": ["g" * 36] * 120}
    if settings.admin_jwt_audience:
        claims["aud"] = settings.admin_jwt_audience
    big = sign({"alg": "HS256"}, claims, SECRET.encode())
    assert len(big) > 4096
    resp = await browser_like.post("/admin/login", data={"token": big})
    assert resp.status_code == 400 and "set-cookie" not in resp.headers
    assert f"{len(big):,} bytes" in resp.text and "4 KB" in resp.text
    assert (await browser_like.get("/admin/v1/whoami", headers={"authorization": f"Bearer {big}"})).status_code == 200


async def test_pages_load_nothing_from_elsewhere(browser_like, token):
    resp = await browser_like.get("/admin/login")
    policy = dict(p.strip().split(" ", 1) for p in resp.headers["content-security-policy"].split(";"))
    assert policy["default-src"] == "'none'" and policy["style-src"] == "'self'"
    assert policy["form-action"] == "'self'" and policy["frame-ancestors"] == "'none'"


async def test_a_models_field_of_a_no_break_space_is_no_blank(browser_like, client, auth, token):
    """Found by QA: ``models=\u00a0`` made a key for every model (``str.strip`` takes a no-break
    space for blank), where the API and the CLI refuse such a name."""
    c = browser_like
    name = unique("nbsp")
    await client.post("/admin/v1/tenants", json={"name": name}, headers=auth())
    await _sign_in(c, token())
    csrf = _csrf((await c.get(f"/admin/tenants/{name}")).text)
    resp = await c.post(f"/admin/tenants/{name}/keys", data={"csrf": csrf, "key_name": "k", "models": "\u00a0"})
    assert resp.status_code == 400 and "allowed_models" in resp.text
    keys = (await client.get("/admin/v1/keys", params={"tenant": name}, headers=auth())).json()["data"]
    assert keys == []
    resp = await c.post(f"/admin/tenants/{name}/keys", data={"csrf": csrf, "key_name": "k", "models": "  "})
    assert resp.status_code == 200  # spaces only: all models, as an empty field
    keys = (await client.get("/admin/v1/keys", params={"tenant": name}, headers=auth())).json()["data"]
    assert [k["allowed_models"] for k in keys] == [None]
