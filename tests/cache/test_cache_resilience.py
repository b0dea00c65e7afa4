"""Redis stopped mid-run: requests are still answered (bypass), the error is logged and
counted, and the cache works again once Redis is back. Uses a private redis-server, never
the shared one."""

import asyncio
import logging
import shutil
import socket
import subprocess

import pytest
from cache_testlib import answer, chat

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server binary")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    def __init__(self) -> None:
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.1):
                    return
            except OSError:
                await asyncio.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # only the server this test started, by its own handle
            self.proc.wait()
            self.proc = None


@pytest.fixture
async def private_redis():
    r = PrivateRedis()
    await r.start()
    yield r
    r.stop()


async def test_redis_down_bypasses_counts_and_recovers(make_cache, policy, private_redis, caplog):
    c = make_cache(url=f"redis://127.0.0.1:{private_redis.port}/0",
                   client_kw={"socket_timeout": 1, "socket_connect_timeout": 1})
    body = chat("How do I export my data?")
    await c.store("acme", body, answer("Settings > export"), policy)
    assert (await c.lookup("acme", body, policy)).outcome == "hit"

    private_redis.stop()
    with caplog.at_level(logging.ERROR, logger="pagegate.cache"):
        r = await c.lookup("acme", body, policy)
        assert r.outcome == "bypass" and r.reason == "redis-down"
        r = await c.lookup("acme", chat("How can I export my data?"), policy)
        assert r.outcome == "bypass" and r.reason == "redis-down"
        await c.store("acme", chat("Another question?"), answer("x"), policy)  # must not raise
    assert c.stats()["redis_errors"] == 3
    assert any("serving without cache" in rec.getMessage() for rec in caplog.records)

    await private_redis.start()  # same port, empty (no persistence)
    assert (await c.lookup("acme", body, policy)).outcome == "miss"
    await c.store("acme", body, answer("Settings > export"), policy)
    assert (await c.lookup("acme", body, policy)).outcome == "hit"
    assert (await c.lookup("acme", chat("How can I export my data?"), policy)).outcome == "semantic-hit"
    assert c.stats()["redis_errors"] == 3
