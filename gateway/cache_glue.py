"""The gateway's side of the semantic cache (``cache/api.py``): the policy from the tenant's
settings and the request's ``Cache-Control``, the body it keys on, and calls that never fail a
request (a broken cache is a bypass, logged)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from cache.api import CacheLookup, CachePolicy
from gateway.schemas import ChatCompletionRequest

log = logging.getLogger("pagegate.cache")

# Transport-only fields: a streamed answer may serve a JSON request and back.
_NOT_KEYED = {"stream", "stream_options", "user"}


def cache_policy(principal: Any, cache_control: str | None) -> CachePolicy:
    """``cache_control``: the request's ``Cache-Control`` lines joined (``Caller.cache_control``;
    a lone ``Pragma: no-cache`` stands for ``no-cache`` there, RFC 9111 5.4). ``max-age=0`` asks
    for nothing stored, as ``no-cache`` does (a browser's reload sends it)."""
    directives = {d.strip().lower().replace(" ", "") for d in (cache_control or "").split(",")}
    return CachePolicy(
        enabled=bool(principal.cache_enabled),
        threshold=float(principal.cache_threshold),
        ttl_s=int(principal.cache_ttl_s),
        max_entries=int(principal.cache_max_entries),
        no_cache="no-cache" in directives or any(_max_age_zero(d) for d in directives),
        no_store="no-store" in directives,
    )


def _max_age_zero(directive: str) -> bool:
    """``max-age=0`` however written (``00``, ``"0"``)."""
    name, _, value = directive.partition("=")
    value = value.strip('"')
    return name == "max-age" and value.isdigit() and int(value) == 0


def cache_body(body: ChatCompletionRequest) -> dict:
    return body.model_dump(mode="json", exclude_none=True, exclude=_NOT_KEYED)


async def cache_lookup(cache: Any, namespace: str, body: dict, policy: CachePolicy) -> CacheLookup:
    try:
        return await cache.lookup(namespace, body, policy)
    except Exception:
        log.exception("cache lookup failed")
        return CacheLookup(outcome="bypass", reason="cache-error")


def cache_store(cache: Any, namespace: str, body: dict, policy: CachePolicy) -> Callable[[dict], Awaitable[None]]:
    async def store(response: dict) -> None:
        await cache.store(namespace, body, response, policy)

    return store
