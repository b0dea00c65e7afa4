"""Process-wide settings the app applies while it serves."""

from __future__ import annotations

import sys

import pytest

from gateway.app import create_app
from tests.gateway.conftest import TENANCY_REDIS_URL


@pytest.mark.parametrize("interval_ms", [0.5, 0.0])
async def test_gil_switch_interval_set_while_serving_then_restored(tmp_path, sqlite_url, redis_prefix, interval_ms):
    """The engine's thread shares the GIL with the event loop: the app lowers the switch interval
    (``gil_switch_interval_ms``; 0 leaves Python's) while it serves and restores it afterwards."""
    from gateway.settings import Settings

    settings = Settings(database_url=sqlite_url, redis_url=TENANCY_REDIS_URL, redis_prefix=redis_prefix,
                        data_dir=str(tmp_path / "data"), usage_spool_dir=str(tmp_path / "spool"),
                        load_engine=False, cache_enabled=False, gil_switch_interval_ms=interval_ms)
    before = sys.getswitchinterval()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        expected = interval_ms / 1000 if interval_ms else before
        assert sys.getswitchinterval() == pytest.approx(expected)
        assert app.state.pagegate.ip_limiter is not None  # and the per-address limit is on
    assert sys.getswitchinterval() == before
    assert Settings.model_fields["gil_switch_interval_ms"].default == 1.0


@pytest.mark.usefixtures("unfrozen")
@pytest.mark.parametrize("freeze", [True, False])
async def test_heap_frozen_while_serving_then_unfrozen(tmp_path, sqlite_url, redis_prefix, freeze):
    """Once started, the app moves what is alive out of the collector's sight (``gc_freeze``, on
    by default): full collections then walk only what was made since, not the model and the
    libraries. Objects made while serving are still collected; shutdown unfreezes."""
    import gc

    from gateway.heap import Refreezer
    from gateway.settings import Settings

    settings = Settings(database_url=sqlite_url, redis_url=TENANCY_REDIS_URL, redis_prefix=redis_prefix,
                        data_dir=str(tmp_path / "data"), usage_spool_dir=str(tmp_path / "spool"),
                        load_engine=False, cache_enabled=False, gc_freeze=freeze)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        state = app.state.pagegate
        assert (gc.get_freeze_count() > 1000) is freeze  # the app, its services and the libraries, at least
        assert any(o is state for o in gc.get_objects()) is not freeze  # frozen: not tracked any more
        assert any(isinstance(cb, Refreezer) for cb in gc.callbacks) is freeze  # later loads frozen too

        class Cycle:
            pass

        a, b = Cycle(), Cycle()
        a.other, b.other = b, a  # garbage made while serving is still collected
        del a, b
        assert gc.collect() >= 2
    assert gc.get_freeze_count() == 0
    assert not any(isinstance(cb, Refreezer) for cb in gc.callbacks)
    assert Settings.model_fields["gc_freeze"].default is True


@pytest.mark.parametrize("origins", ["https://app.example, https://admin.example", ""])
async def test_cors_only_for_the_configured_origins(tmp_path, sqlite_url, redis_prefix, origins):
    """``cors_allow_origins``: a browser page of a listed origin gets its preflight answered (the
    SDK's own headers allowed) and may read the request id and rate-limit headers, errors
    included; another origin's preflight is refused; unset, there is no CORS at all."""
    import httpx

    from gateway.settings import Settings

    settings = Settings(database_url=sqlite_url, redis_url=TENANCY_REDIS_URL, redis_prefix=redis_prefix,
                        data_dir=str(tmp_path / "data"), usage_spool_dir=str(tmp_path / "spool"),
                        load_engine=False, cache_enabled=False, cors_allow_origins=origins)
    app = create_app(settings)
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type, x-stainless-os"}
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        resp = await client.options("/v1/chat/completions", headers=preflight)
        if not origins:
            assert resp.status_code == 405 and "access-control-allow-origin" not in resp.headers
            return
        assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-stainless-os" in resp.headers["access-control-allow-headers"].lower()
        refused = await client.options("/v1/chat/completions", headers={**preflight, "origin": "https://evil.example"})
        assert refused.status_code == 400
        for method in ("PATCH", "PUT", "DELETE"):  # a browser admin app (found by QA: "Disallowed CORS method")
            admin = await client.options("/admin/v1/tenants/x", headers={**preflight,
                                                                        "access-control-request-method": method})
            assert admin.status_code == 200 and method in admin.headers["access-control-allow-methods"], method
        call = await client.get("/v1/models", headers={"origin": "https://admin.example", "authorization": "Bearer no"})
        assert call.status_code == 401 and call.json()["error"]["code"] == "invalid_api_key"
        assert call.headers["access-control-allow-origin"] == "https://admin.example"
        assert "x-request-id" in call.headers["access-control-expose-headers"]
