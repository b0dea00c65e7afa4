"""The admin router's route class: it hands each request the ``AdminContext`` and renders every
refusal — auth, validation, not found, conflicts — as an OpenAI-style error object, whatever
exception handlers the hosting app has (the admin router also runs inside a bare FastAPI app)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from admin.context import AdminContext
from admin.management import Conflict, NotFound
from gateway.errors import ApiError, invalid_request
from gateway.tenancy import TenancyError

SCOPE_KEY = "pagegate.admin"


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def as_api_error(exc: Exception) -> ApiError | None:
    """The ApiError a management exception stands for; None for anything unexpected."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, NotFound):
        return ApiError(404, str(exc), "invalid_request_error", "not_found")
    if isinstance(exc, Conflict):
        return ApiError(409, str(exc), "invalid_request_error", "conflict")
    if isinstance(exc, TenancyError):
        return invalid_request(str(exc))
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        param = ".".join(loc) or None
        return invalid_request(f"{param or 'request'}: {first.get('msg', 'invalid value')}", param=param)
    return None


def _json_error(_request: Request, err: ApiError) -> Response:
    return error_response(err)


def admin_route_class(ctx: AdminContext,
                      render: Callable[[Request, ApiError], Response] = _json_error) -> type[APIRoute]:
    """An APIRoute subclass bound to ``ctx``; refusals are drawn by ``render`` (JSON by default,
    the dashboard passes one that redirects to its sign-in page or shows an error page)."""

    class AdminRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                request.scope[SCOPE_KEY] = ctx
                ctx.adopt(request.app)
                try:
                    return await handler(request)
                except Exception as exc:
                    err = as_api_error(exc)
                    if err is None:
                        raise
                    return render(request, err)

            return handle

    return AdminRoute
