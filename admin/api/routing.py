"""The admin router's route class: it hands each request the ``AdminContext`` and renders every
refusal — auth, validation, not found, conflicts — as an OpenAI-style error object, whatever
exception handlers the hosting app has (the admin router also runs inside a bare FastAPI app).
The API's routes (``api_route_class``) also read and write money exactly, and check the caller's
token before refusing a request they could not read."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from starlette.exceptions import HTTPException

from admin.api.exact_json import ExactJSONRequest, ExactJSONResponse
from admin.auth import SCOPE_READ, SCOPE_WRITE, bearer_token, require
from admin.context import AdminContext
from admin.management import Conflict, NotFound
from admin.schemas import InvalidField, error_message
from gateway.error_handlers import ErrorJSONResponse, too_many_digits
from gateway.errors import ApiError
from gateway.tenancy import TenancyError

SCOPE_KEY = "pagegate.admin"
log = logging.getLogger("pagegate.admin")


def error_response(err: ApiError) -> JSONResponse:
    return ErrorJSONResponse(err.body(), status_code=err.status, headers=err.headers)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    """400 with the field in ``param`` and a code from the /v1 API's set (``invalid_value``,
    ``invalid_type``, ``invalid_json``, ``missing_required_parameter``; found by QA: every admin 400
    said ``code: null``, so a script could not tell a bad value from a bad body)."""
    return ApiError(400, message, "invalid_request_error", code, param)


_UNPARSED = "There was an error parsing the body"  # FastAPI's own words for a body it could not read


def as_api_error(exc: Exception) -> ApiError | None:
    """The ApiError a management exception stands for; None for anything unexpected."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, NotFound):
        return ApiError(404, str(exc), "invalid_request_error", "not_found")
    if isinstance(exc, Conflict):
        return ApiError(409, str(exc), "invalid_request_error", "conflict")
    if isinstance(exc, InvalidField):
        return bad_request(str(exc), exc.param)
    if isinstance(exc, TenancyError):
        return bad_request(str(exc))
    if isinstance(exc, HTTPException) and exc.status_code == 400 and (digits := too_many_digits(exc.__cause__)):
        return bad_request(digits.message)  # FastAPI's body parse: int() refused it
    if isinstance(exc, HTTPException) and exc.status_code == 400 and exc.detail == _UNPARSED:
        # FastAPI's body parse failed outside JSON's grammar: nested too deep (found by QA: code null)
        return bad_request("The request body could not be parsed as JSON (nested too deeply, or not UTF-8).",
                           code="invalid_json")
    if isinstance(exc, HTTPException):  # raised by FastAPI/Starlette themselves (e.g. a bad form body)
        # (and the body limit's 413 for a chunked body, found by QA with code null)
        return ApiError(exc.status_code, str(exc.detail), "invalid_request_error" if exc.status_code < 500
                        else "server_error", "request_too_large" if exc.status_code == 413 else None,
                        headers=dict(exc.headers or {}))
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return bad_request("The request body is not valid JSON.", code="invalid_json")
        if tuple(first.get("loc", ())) == ("body",) and isinstance(first.get("input"), bytes):
            # FastAPI reads a body without a JSON content type as bytes: it was never parsed
            return bad_request("The request body must be a JSON object sent with content-type: application/json "
                               "(or application/<type>+json, or none).", code="invalid_json")
        if tuple(first.get("loc", ())) == ("body",) and first.get("type") == "string_unicode":
            # a key of the body's object that is not Unicode text: pydantic names no field (found
            # by QA: it read "must be a JSON object, not a string")
            return bad_request("The request body holds a key that is not valid Unicode text (a lone surrogate such "
                               "as \\ud800).", code="invalid_value")
        if tuple(first.get("loc", ())) == ("body",) and not isinstance(first.get("input"), dict | None):
            kind = type(first.get("input")).__name__  # parsed JSON, not an object (found by QA: a string was
            kind = {"str": "a string", "list": "an array", "int": "a number", "float": "a number",  # told to
                    "bool": "a boolean"}.get(kind, kind)  # send the content type it had sent)
            return bad_request(f"The request body must be a JSON object, not {kind}.", code="invalid_type")
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        param = ".".join(loc) or None
        message = error_message(first)
        kind = str(first.get("type", ""))
        code = ("missing_required_parameter" if kind == "missing" else
                "invalid_type" if kind.endswith("_type") else "invalid_value")
        return bad_request(f"{param or 'request body'}: {message}", param, code)
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


async def _caller_refusal(ctx: AdminContext, request: Request) -> ApiError | None:
    """401/403 when the request's bearer token may not use the route (GET: read; else: write,
    as every admin API route is declared), None when it may."""
    scope = SCOPE_READ if request.method in ("GET", "HEAD") else SCOPE_WRITE
    try:
        require(await ctx.verifier.verify(bearer_token(request.headers.get("authorization", ""))), scope)
    except ApiError as err:
        return err
    return None


def admin_route_class(ctx: AdminContext, render: Callable[[Request, ApiError], Response] = _json_error, *,
                      authenticate_first: bool = False, strict_query: bool = False) -> type[APIRoute]:
    """An APIRoute subclass bound to ``ctx``; refusals are drawn by ``render`` (JSON by default,
    the dashboard passes one that redirects to its sign-in page or shows an error page).

    ``authenticate_first``: FastAPI reads and checks the body before any dependency runs, so a
    body it cannot read (not JSON, wrong type) would be refused before the token was looked at,
    and a large one would be parsed for nobody. A request that may carry a body (not GET or HEAD)
    has its token checked before FastAPI reads anything; a refusal of an unreadable query is
    preceded by the token check too: an unauthenticated caller gets 401.

    ``strict_query``: a query parameter the route does not declare is refused (400, after the token
    check), as unknown body fields are (found by QA: ``?groupby=model`` answered a report grouped
    by day, and ``/summary?from=…&to=…`` the last 30 days, each with 200)."""

    class AdminRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()
            # the query parameters the route and its dependencies declare
            known = _query_names(self.dependant)

            async def handle(request: Request) -> Response:
                request.scope[SCOPE_KEY] = ctx
                ctx.adopt(request.app)
                if _holds_nul(request):  # no name, key, model or filter holds one (PostgreSQL refuses it: a 500)
                    refusal = await _caller_refusal(ctx, request) if authenticate_first else None
                    return render(request, refusal or bad_request(
                        "The URL holds a NUL character (%00); no name, key, model or filter contains one."))
                if strict_query and (refusal := _query_refusal(request, known)) is not None:
                    return render(request, await _caller_refusal(ctx, request) or refusal)
                if authenticate_first and request.method not in ("GET", "HEAD"):
                    # before FastAPI reads the body: parsing a large one holds the event loop
                    # (found by QA: 8 MB bodies without a token held every request for a second each)
                    refusal = await _caller_refusal(ctx, request)
                    if refusal is not None:
                        return render(request, refusal)
                try:
                    return await handler(request)
                except Exception as exc:
                    unread = isinstance(exc, (RequestValidationError, HTTPException))
                    err = (await _caller_refusal(ctx, request) if authenticate_first and unread else None)
                    err = err or as_api_error(exc) or _server_error(exc)
                    return render(request, err)

            return handle

    return AdminRoute


def _query_refusal(request: Request, known: frozenset[str]) -> ApiError | None:
    """400 for a query parameter the route does not take, one given twice (the last would win
    unnoticed: found by QA, ``?action=key.create&action=key.revoke`` listed revocations only), or
    one given empty."""
    seen: set[str] = set()
    for name, value in request.query_params.multi_items():
        shown = name if len(name) <= 64 else name[:64] + "…"
        if name not in known:
            takes = ", ".join(sorted(known)) or "none"
            return bad_request(f"{shown!r} is not a query parameter of this endpoint (it takes: {takes}).", shown)
        if name in seen:
            return bad_request(f"{shown!r} is given more than once; give it once.", shown)
        if not value:  # (found by QA: ``/keys?tenant=`` listed every tenant's keys)
            return bad_request(f"{shown}: must not be empty (give it a value, or leave it out).", shown)
        seen.add(name)
    return None


def _query_names(dependant: Any) -> frozenset[str]:
    """The query parameters a route's ``Dependant`` and its dependencies declare (by alias)."""
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return frozenset(names)


def _holds_nul(request: Request) -> bool:
    return "\x00" in request.scope["path"] or any("\x00" in k or "\x00" in v
                                                   for k, v in request.query_params.multi_items())


def _exact_json(endpoint: Callable[..., Awaitable[Any]], status_code: int | None) -> Callable[..., Awaitable[Any]]:
    """``endpoint`` with its dict/list result sent as ``ExactJSONResponse`` (a Response passes as is);
    ``functools.wraps`` keeps the signature FastAPI reads the parameters from."""
    @functools.wraps(endpoint)
    async def reply(*args: Any, **kwargs: Any) -> Any:
        result = await endpoint(*args, **kwargs)
        return result if isinstance(result, Response) else ExactJSONResponse(result, status_code=status_code or 200)

    return reply


def api_route_class(ctx: AdminContext) -> type[APIRoute]:
    """The ``/admin/v1`` route class: bearer token checked first, money read and written exactly."""
    base = admin_route_class(ctx, authenticate_first=True, strict_query=True)

    class ApiRoute(base):
        def __init__(self, path: str, endpoint: Callable[..., Awaitable[Any]], **kwargs: Any) -> None:
            super().__init__(path, _exact_json(endpoint, kwargs.get("status_code")), **kwargs)

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                return await handler(ExactJSONRequest(request.scope, request.receive))

            return handle

    return ApiRoute
