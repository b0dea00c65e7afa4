"""The admin router's route class: it hands each request the ``AdminContext`` and renders every
refusal — auth, validation, not found, conflicts — as an OpenAI-style error object, whatever
exception handlers the hosting app has (the admin router also runs inside a bare FastAPI app)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from starlette.exceptions import HTTPException

from admin.context import AdminContext
from admin.management import Conflict, NotFound
from admin.schemas import InvalidField
from gateway.errors import ApiError, invalid_request
from gateway.tenancy import TenancyError

SCOPE_KEY = "pagegate.admin"
log = logging.getLogger("pagegate.admin")


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
    if isinstance(exc, InvalidField):
        return invalid_request(str(exc), param=exc.param)
    if isinstance(exc, TenancyError):
        return invalid_request(str(exc))
    if isinstance(exc, HTTPException):  # raised by FastAPI/Starlette themselves (e.g. a bad form body)
        return ApiError(exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500
                        else "server_error", headers=dict(exc.headers or {}))
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return invalid_request("The request body is not valid JSON.")
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        param = ".".join(loc) or None
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        return invalid_request(f"{param or 'request body'}: {message}", param=param)
    return None


def _server_error(exc: Exception) -> ApiError:
    """Anything unexpected: logged with its traceback, answered in the error shape without it."""
    # OSError: no route to the server; a DBAPIError without a statement failed while connecting
    if isinstance(exc, OSError) or isinstance(exc, DBAPIError) and (exc.statement is None
                                                                     or exc.connection_invalidated):
        log.error("admin request failed: the database is unreachable: %s", exc)
        return ApiError(503, "The database is unreachable; retry shortly.", "server_error", "database_unavailable")
    log.exception("admin request failed", exc_info=exc)
    what = "A database error" if isinstance(exc, SQLAlchemyError) else "An internal error"
    return ApiError(500, f"{what} stopped this admin request; the server log has the details.",
                    "server_error", "internal_error")


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
                    err = as_api_error(exc) or _server_error(exc)
                    return render(request, err)

            return handle

    return AdminRoute
