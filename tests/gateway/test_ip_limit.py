"""The per-client-IP limit on /v1 (slowapi's declared Limiter, evaluated with `limits`' asyncio storage)."""

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
        await first.aclose()
        await second.aclose()


async def test_check_is_async_and_never_uses_the_sync_storage(redis_prefix):
    """The check awaits `limits`' asyncio storage on the loop: slowapi's synchronous (blocking)
    hit is never called, and no thread is involved."""
    limiter = ClientIPLimiter(TENANCY_REDIS_URL, prefix=redis_prefix, rpm=1000)
    sync_calls: list[str] = []
    original = limiter.limiter.limiter.hit

    def hit(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - would block the loop
        sync_calls.append(threading.current_thread().name)
        return original(*args, **kwargs)

    limiter.limiter.limiter.hit = hit
    threads_before = threading.active_count()
    try:
        await asyncio.gather(*(limiter.check(_request("10.2.0.1")) for _ in range(20)))
        stats = await limiter._strategy.get_window_stats(limiter._checks[0][0], "ip", "10.2.0.1", "global")
    finally:
        await limiter.aclose()
    assert sync_calls == [] and threading.active_count() == threads_before
    assert stats.remaining == 1000 - 20


@pytest.mark.parametrize("path", ["pipelined script", "limits' hit"])
async def test_same_window_as_slowapis_own_check(redis_prefix, path):
    """slowapi's own (synchronous) middleware check and the gateway's asynchronous evaluation of
    the same declared limit count in one Redis window: either sees the other's hits. Both of the
    gateway's paths: `limits`' script on the pipelined connection, and `limits`' own async hit."""
    limiter = ClientIPLimiter(TENANCY_REDIS_URL, prefix=redis_prefix, rpm=4)
    assert limiter._acquire is not None
    if path == "limits' hit":
        limiter._acquire = None
    try:
        await limiter.check(_request("10.4.0.1"))
        await limiter.check(_request("10.4.0.1"))
        request = _request("10.4.0.1")
        # slowapi's own check (what SlowAPIASGIMiddleware runs), on a thread: it blocks
        await asyncio.to_thread(limiter.limiter._check_request_limit, request, None, True)
        _, args = request.state.view_rate_limit
        assert tuple(args) == ("ip", "10.4.0.1", "global")
        await limiter.check(_request("10.4.0.1"))  # the 4th request in the window
        with pytest.raises(ApiError) as refused:
            await limiter.check(_request("10.4.0.1"))
        assert refused.value.status == 429
        from slowapi.errors import RateLimitExceeded

        with pytest.raises(RateLimitExceeded):  # and slowapi's own check agrees
            await asyncio.to_thread(limiter.limiter._check_request_limit, _request("10.4.0.1"), None, True)
    finally:
        await limiter.aclose()


async def test_shares_the_gateways_connection_pool(redis_prefix):
    redis = Redis.from_url(TENANCY_REDIS_URL)
    limiter = ClientIPLimiter(TENANCY_REDIS_URL, prefix=redis_prefix, rpm=10, redis=redis)
    try:
        await limiter.check(_request("10.5.0.1"))
        assert limiter._storage.bridge.storage.connection_pool is redis.connection_pool
        await limiter.aclose()  # not its pool: left open
        assert await redis.ping()
    finally:
        await redis.aclose()


async def test_redis_down_fails_closed(redis_prefix):
    limiter = ClientIPLimiter(f"redis://127.0.0.1:{free_port()}/0", prefix=redis_prefix, rpm=5)
    try:
        t0 = time.monotonic()
        with pytest.raises(ApiError) as refused:
            await limiter.check(_request("10.3.0.1"))
        assert refused.value.status == 503 and refused.value.headers["retry-after"] == "1"
        assert time.monotonic() - t0 < 10
    finally:
        await limiter.aclose()


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
            # the admin API shares the address's window (found by QA: two clients without a token
            # posting to /admin slowed every tenant's requests)
            admin = client.post("/admin/v1/tenants", json={"name": "x"})
            assert admin.status_code == 429 and admin.json()["error"]["code"] == "rate_limit_exceeded", admin.text
    finally:
        api_loop.run(_stop(api.server, api.task))


def test_the_admin_api_is_let_through_while_redis_is_down(api_loop, api_engine, redis_prefix, tmp_path):
    """The per-address limit fails closed on /v1 but not on /admin, which needs only the database:
    an admin can still revoke keys during a Redis outage."""
    api = _launch(api_loop, api_engine, f"sqlite+aiosqlite:///{tmp_path / 'ip.db'}", tmp_path,
                  redis_prefix, ip_rpm=3)
    state = api.app.state.pagegate
    saved = state.ip_limiter
    state.ip_limiter = ClientIPLimiter(f"redis://127.0.0.1:{free_port()}/0", prefix=redis_prefix, rpm=3)
    try:
        with httpx.Client(base_url=api.base_url, timeout=30) as client:
            v1 = client.get("/v1/models", headers={"authorization": f"Bearer {api.key}"})
            assert v1.status_code == 503 and v1.json()["error"]["code"] == "store_unavailable", v1.text
            admin = client.get("/admin/v1/tenants")
            assert admin.status_code == 401 and admin.json()["error"]["code"] == "invalid_token", admin.text
    finally:
        api_loop.run(state.ip_limiter.aclose())
        state.ip_limiter = saved
        api_loop.run(_stop(api.server, api.task))
