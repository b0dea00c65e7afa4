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
