"""Per-client-IP request-rate limit on ``/v1/*``, checked before authentication: slowapi.

A flood of requests from one address (guessed keys, a runaway script) is refused with 429
``rate_limit_exceeded`` before it costs a key lookup in the database. The limit is slowapi's own
``Limiter`` (an application-wide limit of ``settings.ip_rpm`` per minute keyed by the client
address, moving window, Redis storage shared by every gateway process).

slowapi is synchronous: its check makes blocking Redis calls through ``limits``' sync storage, and
slowapi's middlewares run it on the event loop. So the gateway calls slowapi's check
(``Limiter._check_request_limit``, what ``SlowAPIASGIMiddleware`` calls) on a small thread pool of
its own: the event loop never waits on Redis here, it awaits the thread's answer.

Per-key and per-tenant request limits stay in ``gateway.limits`` (one atomic async Lua script for
both windows, limits read per request from the tenant's settings), which slowapi cannot express.

Redis keys: ``<prefix>rl:LIMITER/ip/<client address>/global/<rpm>/1/minute``. Behind a reverse proxy the
client address is the proxy's unless uvicorn is told to trust ``X-Forwarded-For``
(``--proxy-headers --forwarded-allow-ips``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
import warnings

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.error_handlers import error_response
from gateway.errors import ApiError, rate_limited
from gateway.limits import format_reset, storage_uri, store_unavailable

log = logging.getLogger(__name__)


def client_address(request: Request) -> str:
    """slowapi key function: the peer address uvicorn saw (after its proxy-header handling)."""
    return request.client.host if request.client else "unknown"


class ClientIPLimiter:
    """``await check(request)``: one request from the client's per-minute window, or ApiError
    429 (``retry-after``) / 503 when Redis is unreachable (fail closed like every limit)."""

    THREADS = 8

    def __init__(self, redis_url: str, *, prefix: str, rpm: int) -> None:
        from slowapi import Limiter

        if rpm < 1:
            raise ValueError("rpm must be >= 1 (0 means: do not build a limiter)")
        self.rpm = rpm
        with warnings.catch_warnings():  # settings come from Settings: no config file is read
            warnings.simplefilter("ignore")
            self.limiter = Limiter(
                key_func=client_address, application_limits=[f"{rpm}/minute"],
                storage_uri=storage_uri(redis_url, asyncio_client=False),
                storage_options={"key_prefix": f"{prefix}rl"}, strategy="moving-window", key_prefix="ip",
                key_style="url", headers_enabled=False, swallow_errors=False, in_memory_fallback_enabled=False,
                config_filename=os.devnull)
        self._executor = concurrent.futures.ThreadPoolExecutor(self.THREADS, thread_name_prefix="ip-limit")

    async def check(self, request: Request) -> None:
        loop = asyncio.get_running_loop()
        error = await loop.run_in_executor(self._executor, self._check, request)
        if error is not None:
            raise error

    def _check(self, request: Request) -> ApiError | None:
        """On the pool's thread: slowapi's own check (blocking Redis calls)."""
        from slowapi.errors import RateLimitExceeded

        try:
            self.limiter._check_request_limit(request, None, True)
            return None
        except RateLimitExceeded:
            limit, args = request.state.view_rate_limit
            try:
                reset_s = max(0.001, self.limiter.limiter.get_window_stats(limit, *args).reset_time - time.time())
            except Exception:
                reset_s = 60.0
            return rate_limited(
                f"Too many requests from your address: limit {self.rpm} per minute. "
                f"Please try again in {format_reset(reset_s)}.", retry_after_s=reset_s,
                headers={"x-ratelimit-limit-requests": str(self.rpm), "x-ratelimit-remaining-requests": "0",
                         "x-ratelimit-reset-requests": format_reset(reset_s)})
        except Exception as exc:  # Redis unreachable
            log.warning("ip limit: storage unavailable: %r", exc)
            return store_unavailable("rate-limit")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class ClientIPLimitMiddleware:
    """Pure ASGI: ``/v1/*`` requests pass ``app.state.pagegate.ip_limiter`` (when set) first."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            state = getattr(scope["app"].state, "pagegate", None)
            limiter = getattr(state, "ip_limiter", None)
            if limiter is not None:
                try:
                    await limiter.check(Request(scope))
                except ApiError as err:
                    await error_response(err)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
