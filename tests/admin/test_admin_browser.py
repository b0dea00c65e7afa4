"""End to end in headless Chromium (Debian's ``chromium`` package, driven by playwright; no browser
download): sign in, create a tenant and a key through the dashboard, see the cost chart render
from usage rows, and save a screenshot under tests/artifacts/."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from admin_testlib import unique, usage_row
from sqlalchemy import select

from admin.auth import mint_token
from gateway.db.models import Tenant
from gateway.db.session import Database

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build_app(settings):
    """The real gateway app without an engine when it exists; else a bare app with the admin router."""
    try:
        from gateway.app import create_app
    except ImportError:
        create_app = None
    if create_app is not None:
        return create_app(settings.model_copy(update={"load_engine": False, "cache_enabled": False}))
    from fastapi import FastAPI

    import admin

    app = FastAPI()
    app.include_router(admin.build_admin_router(settings))
    return app


@pytest.fixture
def server(settings):
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(_build_app(settings), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=15)


def _insert_usage(settings, tenant_name: str) -> list[float]:
    """Usage on the last five days; returns the cost per day (oldest first)."""
    costs = [0.12, 0.0, 0.31, 0.05, 0.2]

    async def go() -> None:
        db = Database(settings.database_url)
        try:
            async with db.sessionmaker() as s:
                tid = await s.scalar(select(Tenant.id).where(Tenant.name == tenant_name))
                now = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
                for i, cost in enumerate(costs):
                    if cost:
                        s.add(usage_row(tenant_id=tid, key_id=None, model="smollm2-135m-instruct",
                                        when=now - timedelta(days=len(costs) - 1 - i), prompt=1000 * (i + 1),
                                        cached=0, completion=200, cost=str(cost), saved="0.02", latency=150.0,
                                        cache="hit" if i == 2 else "miss"))
                await s.commit()
        finally:
            await db.dispose()

    # playwright's sync API keeps an event loop on this thread: write from another one
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result()
    return costs


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # once: HTTP tests cover PostgreSQL
def test_dashboard_in_chromium(server, settings):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    token = mint_token(settings, subject="browser-admin", ttl_s=600)
    name = unique("browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            page.goto(f"{server}/admin/tenants")
            assert page.url.endswith("/admin/login")  # signed out → sign-in page

            page.fill("#token", token)
            page.click("#login-form button[type=submit]")
            page.wait_for_url("**/admin/tenants")
            assert "browser-admin" in page.inner_text("header")
            cookies = {c["name"]: c for c in page.context.cookies()}
            assert cookies["pagegate_admin"]["httpOnly"] and cookies["pagegate_admin"]["sameSite"] == "Strict"
            assert page.evaluate("document.cookie") == ""  # not readable from scripts

            page.fill("#create-tenant input[name=name]", name)
            page.fill("#create-tenant input[name=rpm]", "120")
            page.fill("#create-tenant input[name=budget_usd]", "10")
            page.click("#create-tenant button[type=submit]")
            page.wait_for_url(f"**/admin/tenants/{name}")
            assert name in page.inner_text("#tenant-name")

            page.fill("#create-key input[name=key_name]", "browser-key")
            page.click("#create-key button[type=submit]")
            new_key = page.inner_text("#new-key").strip()
            assert new_key.startswith("pg-") and len(new_key) >= 40
            assert page.locator("#keys tbody tr").count() == 1
            assert new_key[:10] in page.inner_text("#keys")

            costs = _insert_usage(settings, name)
            page.goto(f"{server}/admin/tenants/{name}")
            chart = page.locator("#chart-cost")
            chart.wait_for(state="visible")
            box = chart.bounding_box()
            assert box and box["width"] > 300 and box["height"] > 60
            bars = page.locator("#chart-cost rect.bar")
            assert bars.count() == 30
            heights = [float(bars.nth(i).get_attribute("height")) for i in range(30)]
            values = [float(bars.nth(i).get_attribute("data-value")) for i in range(30)]
            assert values[-5:] == pytest.approx(costs)
            tallest = max(range(30), key=lambda i: heights[i])
            assert values[tallest] == pytest.approx(max(costs)) and heights[tallest] > 50
            assert heights[-4] == 0  # the day without usage draws no bar
            rendered = bars.nth(tallest).bounding_box()  # the browser laid the bar out, not just parsed it
            assert rendered and rendered["height"] > 20
            assert page.locator("#chart-savings rect.bar").count() == 30
            assert page.inner_text("#stat-requests").strip() == "4"
            page.screenshot(path=str(ARTIFACTS / "admin-dashboard-tenant.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "admin-dashboard-tenant.png").stat().st_size > 10_000
