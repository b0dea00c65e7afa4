"""Dashboard sign-in state: the admin JWT lives in an HttpOnly, SameSite=Strict cookie scoped to
``/admin``; every form carries a CSRF token derived from it (HMAC with the admin secret), and
POSTs from another origin are refused."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import SplitResult, urlsplit

from fastapi import Depends, Form, Request

from admin.api.deps import ContextDep
from admin.auth import SCOPE_WRITE, AdminPrincipal, forbidden, unauthorized
from gateway.errors import ApiError

COOKIE = "pagegate_admin"


def csrf_token(secret: str, admin_token: str) -> str:
    return hmac.new(secret.encode(), b"csrf:" + admin_token.encode(), hashlib.sha256).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class Viewer:
    """The signed-in admin: verified principal, the form token for this session."""

    principal: AdminPrincipal
    csrf: str

    @property
    def can_write(self) -> bool:
        return self.principal.has(SCOPE_WRITE)


async def _viewer(request: Request, ctx: ContextDep) -> Viewer:
    token = request.cookies.get(COOKIE)
    if not token:
        raise unauthorized("Sign in with an admin token.")
    principal = await ctx.verifier.verify(token)
    if not principal.has("admin:read"):
        raise forbidden("admin:read")
    return Viewer(principal=principal, csrf=csrf_token(ctx.settings.admin_jwt_secret, token))


ViewerDep = Annotated[Viewer, Depends(_viewer)]


def url_parts(url: str) -> SplitResult | None:
    """A header URL split; None when it cannot be parsed (found by QA: ``http://[x`` raised
    ValueError from ``urlsplit``, a 500 before sign-in)."""
    try:
        return urlsplit(url)
    except ValueError:
        return None


def same_origin(request: Request) -> None:
    """Refuse cross-site form posts (defence in depth next to SameSite=Strict). ``Origin: null`` is
    refused too: browsers send it from opaque origins (sandboxed frames, ``data:`` pages), never
    from the dashboard's own pages, whose referrer policy is ``same-origin``; without the header
    (scripts, curl) the CSRF token alone decides."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    parts = url_parts(origin) if origin else None
    if origin and (origin == "null" or parts is None or parts.netloc != request.url.netloc):
        raise ApiError(403, "Cross-site form submission refused.", "permission_error", "csrf")


async def _editor(request: Request, viewer: ViewerDep, csrf: Annotated[str, Form()] = "") -> Viewer:
    same_origin(request)
    # bytes: compare_digest refuses str with non-ASCII characters (a TypeError, found by QA)
    if not hmac.compare_digest(csrf.encode(), viewer.csrf.encode()):
        raise ApiError(403, "The form expired or was not sent by this dashboard; reload and retry.",
                       "permission_error", "csrf")
    if not viewer.can_write:
        raise forbidden(SCOPE_WRITE)
    return viewer


EditorDep = Annotated[Viewer, Depends(_editor)]
