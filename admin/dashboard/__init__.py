"""Server-rendered admin dashboard under ``/admin``."""

from __future__ import annotations

from admin.dashboard.routes import build_dashboard_router

__all__ = ["build_dashboard_router"]
