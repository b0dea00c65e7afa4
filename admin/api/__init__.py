"""The admin JSON API under ``/admin/v1`` (bearer JWT; see ``admin.auth``)."""

from __future__ import annotations

from fastapi import APIRouter

from admin.api import audit, keys, prices, reports, tenants
from admin.api.routing import api_route_class
from admin.context import AdminContext


def build_api_router(ctx: AdminContext) -> APIRouter:
    # a body without a content type is JSON, as on /v1 (a bearer token: no cross-site form can send one)
    router = APIRouter(prefix="/admin/v1", route_class=api_route_class(ctx), tags=["admin"], strict_content_type=False)
    for module in (tenants, keys, prices, reports, audit):
        module.add_routes(router)
    return router
