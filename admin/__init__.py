"""pagegate's admin surface: JSON API under ``/admin/v1``, dashboard pages under ``/admin``,
and ``pagegate admin …`` CLI commands (``admin.cli``)."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import APIRouter
    from redis.asyncio import Redis

    from gateway.db.session import Database
    from gateway.settings import Settings


def build_admin_router(settings: Settings, *, database: Database | None = None,
                       redis: Redis | None = None) -> APIRouter:
    """One router with the admin API (``/admin/v1/...``) and the dashboard (``/admin/...``).

    ``database``/``redis`` let the gateway share its own handles; by default they are opened from
    ``settings`` on first use and closed when the app shuts down (the router's lifespan).
    """
    from fastapi import APIRouter

    from admin.api import build_api_router
    from admin.context import AdminContext
    from admin.dashboard import build_dashboard_router

    ctx = AdminContext(settings, database=database, redis=redis)
    log = logging.getLogger("pagegate.admin")
    if settings.placeholder_admin_secret:
        if settings.dev_mode:
            log.warning("PAGEGATE_ADMIN_JWT_SECRET is the built-in default: anyone can mint admin tokens; set your own")
        else:
            log.warning("PAGEGATE_ADMIN_JWT_SECRET is the built-in default: HS256 admin tokens are refused "
                        "(outside --dev); set your own secret")
    elif not settings.admin_jwt_secret:
        log.warning("PAGEGATE_ADMIN_JWT_SECRET is empty: HS256 admin tokens are refused; set a secret of your own"
                    + ("" if settings.admin_jwks_url else " (or PAGEGATE_ADMIN_JWKS_URL: no admin token works now)"))
    elif len(settings.admin_jwt_secret.encode()) < 32:
        log.warning("PAGEGATE_ADMIN_JWT_SECRET is shorter than 32 bytes: HS256 admin tokens can be brute-forced")

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await ctx.aclose()

    router = APIRouter(lifespan=lifespan)
    router.include_router(build_api_router(ctx))
    router.include_router(build_dashboard_router(ctx))
    router.admin_context = ctx  # type: ignore[attr-defined]  # tests and embedders reach it here
    return router
