"""Exception handlers that turn every refusal into an OpenAI error object.

- ``ApiError`` → its status, body and headers (``retry-after`` …);
- request validation (bad JSON, wrong types, out-of-range values) → 400 ``invalid_request_error``
  naming the field in ``param`` (``messages[0].content``);
- Starlette's HTTP errors (unknown route 404, wrong method 405 with ``Allow``, a body FastAPI cannot
  decode 400 ``invalid_json``, a body over the size limit 413) → the same shape;
- on ``/v1``, a request without a valid key gets its 401/403 before any complaint about its body.
The catch-all 500 lives in ``gateway.middleware`` so that it also carries ``x-request-id``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from gateway.errors import ApiError, quoted_name

# Pydantic puts the union member it tried into ``loc``; those are not field names.
_TYPE_TAGS = {"str", "int", "float", "bool", "function-after", "function-before", "function-wrap",
              "tagged-union"}


class ErrorJSONResponse(JSONResponse):
    """An error's JSON; text UTF-8 cannot hold (a lone surrogate quoted from the request) is
    written as JSON's ``\\ud800`` escape instead of failing the answer (a 500: found by QA)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def error_response(err: ApiError) -> JSONResponse:
    return ErrorJSONResponse(err.body(), status_code=err.status, headers=err.headers or None)


def param_from_loc(loc: tuple[Any, ...]) -> str | None:
    """``("body", "messages", 0, "content", "str")`` → ``"messages[0].content"``."""
    out = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str):
            if part in _TYPE_TAGS or "[" in part or "(" in part or part.startswith(("constrained-", "json-")):
                continue
            out += f".{part}" if out else part
    return out or None


# the JSON a client sent, in its own words where Python's differ (None, True, False)
_JSON_WORDS = {None: "null", True: "true", False: "false"}


def validation_error(errors: list[dict[str, Any]]) -> ApiError:
    """The most specific error (deepest field; for unions that is the member that nearly fit)."""
    if not errors:
        return ApiError(400, "Invalid request body.")
    # deepest field first; at equal depth, a value of the right type that breaks a rule (17 stop
    # strings: "at most 16") says more than the union member of the wrong type ("not a string")
    first = max(errors, key=lambda e: (len(param_from_loc(tuple(e.get("loc", ()))) or ""),
                                       not str(e.get("type", "")).endswith("_type")))
    kind = first.get("type")
    if kind == "json_invalid" or (kind == "model_attributes_type" and isinstance(first.get("input"), bytes)):
        return ApiError(400, _INVALID_JSON, code="invalid_json")
    param = param_from_loc(tuple(first.get("loc", ())))
    if param is not None:  # (a key the client made up is part of it: cut, as a quoted name is; QA)
        param = quoted_name(param)
    if param is None and kind == "missing":  # no body at all: no JSON to read (a QA find: invalid_type)
        return ApiError(400, "The request body is empty; it must be a JSON object.", code="invalid_json")
    if param is None:  # the body is not an object
        return ApiError(400, "The request body must be a JSON object.", code="invalid_type")
    if kind == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'.", code="missing_required_parameter",
                        param=param)
    value = first.get("input")
    if isinstance(value, dict | list):
        shown = type(value).__name__
    elif value is None or isinstance(value, bool):  # (these only: 1 == True, so 1 would read "true")
        shown = _JSON_WORDS[value]
    else:
        shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    reason = first.get("msg", "invalid value").replace(" after validation", "")  # pydantic's, not ours
    if kind in ("model_type", "model_attributes_type", "dict_type"):  # the JSON and the Python parser
        reason = "Input should be a JSON object"  # word it apart ("... instance of StreamOptions")
    got = f" (got {shown})"
    if kind == "value_error":  # our own validators' words, without pydantic's prefix: they say what was
        reason = reason.removeprefix("Value error, ").rstrip(".")  # wrong in a whole mapping or list
        got = "" if isinstance(value, dict | list) else got
    message = f"Invalid value for '{param}': {reason}{got}."
    code = "invalid_type" if str(kind).endswith("_type") else "invalid_value"
    return ApiError(400, message, "invalid_request_error", code, param)


_INVALID_JSON = ("We could not parse the JSON body of your request. (HINT: send a JSON object with the "
                 "header Content-Type: application/json.)")


def is_json_content_type(content_type: str | None) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters ignored (FastAPI's test),
    or no content type at all, as FastAPI reads it with ``strict_content_type=False`` (the ``/v1``
    routers): ``requests.post(url, data=json.dumps(body))`` sends none (found by QA). A browser's
    cross-site request cannot carry the API key, so this opens no CSRF."""
    if not content_type:
        return True
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def content_type_refusal(content_type: str | None) -> ApiError | None:
    """400 for a body sent with a content type that is not JSON's, saying so (found by QA: curl's
    ``-d`` sends a form's type, and "We could not parse the JSON body" sent people to their JSON)."""
    if is_json_content_type(content_type):
        return None
    shown = "".join(c for c in content_type[:100] if c.isprintable())
    return ApiError(400, f"The request body must be JSON sent with the header Content-Type: application/json "
                         f"(this request's is '{shown}').", code="invalid_json")


_HTTP_ERRORS = {  # Starlette's and FastAPI's own refusals, in OpenAI's words
    404: ("not_found", "Unknown request URL. Please check the URL and method."),
    405: ("method_not_allowed", "This method is not allowed for this URL. Please check the URL and method."),
    400: ("invalid_json", _INVALID_JSON),  # FastAPI: a body that is not UTF-8, too deeply nested, ...
    413: ("request_too_large", None),
}


def too_many_digits(exc: BaseException | None) -> ApiError | None:
    """Valid JSON whose number Python's ``int()`` refuses (over ``sys.get_int_max_str_digits()``
    digits): named as such rather than "could not parse"; None for any other failure."""
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return ApiError(400, f"A number in the JSON body has more than {sys.get_int_max_str_digits()} digits; "
                             "no field takes such a number.", "invalid_request_error", "invalid_value")
    return None


def unknown_url() -> ApiError:
    """What an unknown URL gets (Starlette's 404, in OpenAI's words), for a route that matched it."""
    code, message = _HTTP_ERRORS[404]
    return ApiError(404, message, "invalid_request_error", code)


def http_error_response(exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own refusals (404, 405, 413, ...) as OpenAI errors."""
    code, message = _HTTP_ERRORS.get(exc.status_code, (None, None))
    return error_response(ApiError(exc.status_code, message or str(exc.detail), "invalid_request_error",
                                   code, None, dict(exc.headers or {})))


async def key_refusal(request: Request) -> ApiError | None:
    """The refusal a ``/v1`` request without a valid key gets: FastAPI parses and validates the
    body before the route's authentication runs, but a caller without a key learns nothing about
    its body (401 before 400, as OpenAI answers)."""
    if not request.url.path.startswith("/v1/"):
        return None
    state = getattr(request.app.state, "pagegate", None)
    services = getattr(state, "services", None)
    if services is None:
        return None
    try:
        await services.auth.authenticate(request.headers.get("authorization"),
                                         query_string=request.scope.get("query_string", b""))
    except ApiError as err:
        return err
    return None


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str:
    """Every method some route of the app answers at this path (each asked of the router as it
    routes, included routers too). Starlette's 405 names those of the first route whose path
    matched: GET and HEAD of one path declared apart gave ``Allow: HEAD``."""
    routes = request.app.router.routes
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in routes):
            allowed.append(method)
    if "GET" in allowed and "HEAD" not in allowed and request.url.path.startswith("/admin"):
        allowed.insert(allowed.index("GET") + 1, "HEAD")  # answered as GET (``gateway.middleware``)
    return ", ".join(allowed)


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = await key_refusal(request) or validation_error(list(exc.errors()))
        if err.code == "invalid_json":  # a body FastAPI did not read as JSON: its type, if that is why
            err = content_type_refusal(request.headers.get("content-type")) or err
        return error_response(err)

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            refused = await key_refusal(request) or too_many_digits(exc.__cause__)  # (FastAPI's body parse)
            if refused is not None:
                return error_response(refused)
        if exc.status_code == 405:
            allow = allowed_methods(request)
            if allow:
                exc = StarletteHTTPException(405, exc.detail, {**(exc.headers or {}), "Allow": allow})
        return http_error_response(exc)

    app.add_exception_handler(ApiError, on_api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]
