"""OpenAI-format errors. Anything the gateway refuses is raised as ``ApiError`` and rendered as
``{"error": {"message", "type", "param", "code"}}`` with its status and headers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __str__(self) -> str:
        return f"{self.status} {self.code or self.type}: {self.message}"


def invalid_request(message: str, *, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


def unsupported(param: str, message: str | None = None) -> ApiError:
    """400 for a known OpenAI field this gateway cannot honour (refused rather than ignored)."""
    return invalid_request(message or f"'{param}' is not supported by this model.", param=param,
                           code="unsupported_parameter")


def invalid_api_key(message: str = "Incorrect API key provided.") -> ApiError:
    return ApiError(401, message, "invalid_request_error", "invalid_api_key")


def permission_denied(message: str, *, code: str = "permission_denied") -> ApiError:
    return ApiError(403, message, "permission_error", code)


QUOTED_CHARS = 256  # a name quoted back in an error, at most (found by a security QA: a 4 MB model name came back whole)


def cut_name(name: str) -> str:
    """``name`` cut to ``QUOTED_CHARS`` characters, for a message that quotes it with ``!r``."""
    return name if len(name) <= QUOTED_CHARS else f"{name[:QUOTED_CHARS]}… ({len(name)} characters)"


def quoted_name(name: str) -> str:
    """``name`` as an error message quotes it: cut to ``QUOTED_CHARS`` characters, a lone surrogate
    written as its escape (``\\ud800``: found by QA, one quoted whole made the JSON answer a 500)."""
    shown = cut_name(name)
    try:
        shown.encode()
    except UnicodeEncodeError:
        shown = shown.encode("utf-8", "backslashreplace").decode()
    return shown


def model_not_found(model: str, served_by: str | None = None) -> ApiError:
    """404. ``served_by``: the model exists, for this key, on another route (OpenAI says "This is
    not a chat model" there); name that route instead of saying it does not exist (found by QA)."""
    model = quoted_name(model)
    message = (f"The model `{model}` does not exist or you do not have access to it." if served_by is None
               else f"The model `{model}` is not served here: it is served on {served_by}.")
    return ApiError(404, message, "invalid_request_error", "model_not_found", "model")


def rate_limited(message: str, *, retry_after_s: float | None, headers: dict[str, str] | None = None) -> ApiError:
    """429. ``retry_after_s`` None: the request can never succeed as sent, so no ``retry-after``
    but ``x-should-retry: false`` (the openai SDKs would retry a 429)."""
    h = dict(headers or {})
    if retry_after_s is None:
        h["x-should-retry"] = "false"
    else:
        h["retry-after"] = str(max(1, int(retry_after_s + 0.999)))
        h["retry-after-ms"] = str(max(1, int(retry_after_s * 1000)))
    return ApiError(429, message, "rate_limit_exceeded", "rate_limit_exceeded", None, h)


def insufficient_quota(message: str, *, retry_after_s: float | None) -> ApiError:
    err = rate_limited(message, retry_after_s=retry_after_s)
    err.type = "insufficient_quota"
    err.code = "insufficient_quota"
    return err


def shutting_down(*, started: bool = True) -> ApiError:
    """503 for a request the server stopped because it is shutting down (``gateway.shutdown``);
    ``started=False``: one refused on arrival (it was told it had been stopped before it finished:
    a QA find)."""
    what = "stopped this request before it finished" if started else "did not start this request"
    return ApiError(503, f"The server is shutting down and {what}; retry it.",
                    "server_error", "server_shutting_down", headers={"retry-after": "1"})


def overloaded(message: str = "The engine is overloaded; retry shortly.", retry_after_s: float = 1.0) -> ApiError:
    # (retry-after-ms too, as the 429s carry it: found by QA, the SDKs read it first)
    return ApiError(503, message, "server_error", "overloaded", None,
                    {"retry-after": str(max(1, int(retry_after_s))), "retry-after-ms": str(max(1, int(retry_after_s * 1000)))})
