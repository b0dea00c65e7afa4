"""The per-client-IP limit on /v1 (slowapi's Limiter on Redis, run off the event loop)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from redis.asyncio import Redis
from starlette.requests import Request

from gateway.errors import ApiError
from gateway.ip_limit import ClientIPLimiter
from tests.gateway.conftest import TENANCY_REDIS_URL, _launch, _stop, free_port


def _request(ip: str, path: str = "/v1/models") -> Request:
    return Request({"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b"",
                    "client": (ip, 40000)})


async def test_limit_per_address_on_shared_redis(redis_prefix):
    first = ClientIPLimiter(TENANCY_REDIS_URL, prefix=redis_prefix, rpm=3)
    second = ClientIPLimiter(TENANCY_REDIS_URL, prefix=redis_prefix, rpm=3)  # another process
    try:
        await first.check(_request("10.1.1.1"))
        await second.check(_request("10.1.1.1", "/v1/chat/completions"))  # one window for all of /v1
        await first.check(_request("10.1.1.1"))
        with pytest.raises(ApiError) as refused:
            await second.check(_request("10.1.1.1"))
        err = refused.value
        assert (err.status, err.code) == (429, "rate_limit_exceeded")
        assert 1 <= int(err.headers["retry-after"]) <= 60 and int(err.headers["retry-after-ms"]) > 0
        assert err.headers["x-ratelimit-remaining-requests"] == "0"
        await first.check(_request("10.1.1.2"))  # other addresses are not affected
        r = Redis.from_url(TENANCY_REDIS_URL)
        try:  # slowapi's storage: the window lives in the shared Redis under the gateway's prefix
            keys = [k.decode() async for k in r.scan_iter(match=f"{redis_prefix}rl:*ip/*")]
        finally:
            await r.aclose()
        assert any("10.1.1.1" in k for k in keys) and any("10.1.1.2" in k for k in keys)
    finally:
        first.close()
        second.close()


async def test_check_does_not_block_the_event_loop(redis_prefix):
    """slowapi's blocking Redis calls run on the limiter's threads, never on the loop's."""
    limiter = ClientIPLimiter(TENANCY_REDIS_URL, prefix=redis_prefix, rpm=1000)
    threads: set[str] = set()
    original = limiter.limiter.limiter.hit

    def hit(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - records where slowapi's hit runs
        threads.add(threading.current_thread().name)
        return original(*args, **kwargs)

    limiter.limiter.limiter.hit = hit  # the real hit, on the real Redis; only observed
    try:
        await asyncio.gather(*(limiter.check(_request("10.2.0.1")) for _ in range(20)))
    finally:
        limiter.close()
    assert threads and all(name.startswith("ip-limit") for name in threads)


async def test_redis_down_fails_closed(redis_prefix):
    limiter = ClientIPLimiter(f"redis://127.0.0.1:{free_port()}/0", prefix=redis_prefix, rpm=5)
    try:
        t0 = time.monotonic()
        with pytest.raises(ApiError) as refused:
            await limiter.check(_request("10.3.0.1"))
        assert refused.value.status == 503 and refused.value.headers["retry-after"] == "1"
        assert time.monotonic() - t0 < 10
    finally:
        limiter.close()


def test_http_429_before_authentication(api_loop, api_engine, redis_prefix, tmp_path):
    """Over HTTP: the 4th /v1 request from 127.0.0.1 in a minute is refused before the key is
    even looked at (a wrong key also gets 429, not 401); /health is not limited."""
    api = _launch(api_loop, api_engine, f"sqlite+aiosqlite:///{tmp_path / 'ip.db'}", tmp_path,
                  redis_prefix, ip_rpm=3)
    try:
        auth = {"authorization": f"Bearer {api.key}"}
        with httpx.Client(base_url=api.base_url, timeout=30) as client:
            for _ in range(2):
                assert client.get("/v1/models", headers=auth).status_code == 200
            assert client.get("/v1/models", headers={"authorization": "Bearer pg-nope"}).status_code == 401
            refused = client.get("/v1/models", headers={"authorization": "Bearer pg-nope"})
            assert refused.status_code == 429, refused.text
            body = refused.json()["error"]
            assert (body["type"], body["code"]) == ("rate_limit_exceeded", "rate_limit_exceeded")
            assert refused.headers["retry-after"] and refused.headers["x-request-id"].startswith("req_")
            assert client.get("/v1/models", headers=auth).status_code == 429
            assert client.get("/health").status_code == 200
    finally:
        api_loop.run(_stop(api.server, api.task))
