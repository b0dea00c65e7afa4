"""The gateway's side of the semantic cache (``cache/api.py``): the policy from the tenant's
settings and the request's ``Cache-Control``, the body it keys on, and calls that never fail a
request (a broken cache is a bypass, logged)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from cache.api import CacheLookup, CachePolicy
from gateway.log_throttle import LogThrottle
from gateway.schemas import ChatCompletionRequest

log = logging.getLogger("pagegate.cache")

# Transport-only fields: a streamed answer may serve a JSON request and back.
_NOT_KEYED = {"stream", "stream_options", "user"}


def cache_policy(principal: Any, cache_control: str | None) -> CachePolicy:
    """``cache_control``: the request's ``Cache-Control`` lines joined (``Caller.cache_control``;
    a lone ``Pragma: no-cache`` stands for ``no-cache`` there, RFC 9111 5.4). ``max-age=0`` asks
    for nothing stored, as ``no-cache`` does (a browser's reload sends it); ``max-age=N`` for an
    answer stored at most N seconds ago (RFC 9111 5.2.1.1; the smallest when repeated, one that is
    not a number of seconds is ignored)."""
    directives = {d.strip().lower().replace(" ", "") for d in (cache_control or "").split(",")}
    ages = [age for d in directives if (age := _max_age(d)) is not None]
    max_age = min(ages) if ages else None
    return CachePolicy(
        enabled=bool(principal.cache_enabled),
        threshold=float(principal.cache_threshold),
        ttl_s=int(principal.cache_ttl_s),
        max_entries=int(principal.cache_max_entries),
        no_cache="no-cache" in directives or max_age == 0,
        no_store="no-store" in directives,
        max_age_s=max_age or None,
    )


def _max_age(directive: str) -> int | None:
    """The seconds of a ``max-age`` directive however written (``00``, ``"60"``); None for another
    directive or a value that is not a number of seconds. Past 2**31 seconds (RFC 9111 1.2.2: a
    larger value is taken as 2**31) it asks for nothing more than the entries' own TTL."""
    name, _, value = directive.partition("=")
    value = value.strip('"')
    if name != "max-age" or not value.isdigit() or not value.isascii():
        return None
    value = value.lstrip("0") or "0"  # (leading zeros are not digits of the value: found by QA)
    return 2**31 if len(value) > 10 else min(int(value), 2**31)


def cache_body(body: ChatCompletionRequest) -> dict:
    return body.model_dump(mode="json", exclude_none=True, exclude=_NOT_KEYED)


async def cache_lookup(cache: Any, namespace: str, body: dict, policy: CachePolicy) -> CacheLookup:
    try:
        return await cache.lookup(namespace, body, policy)
    except Exception:  # (one traceback per 10 s: a fault that fails every lookup logged one each, found by QA)
        _LOOKUP_FAILED.log(log, logging.ERROR, "cache lookup failed; the request bypasses the cache", exc_info=True)
        return CacheLookup(outcome="bypass", reason="cache-error")


_LOOKUP_FAILED = LogThrottle()


def cache_store(cache: Any, namespace: str, body: dict, policy: CachePolicy, *,
                still_valid: Callable[[], Awaitable[bool]] | None = None) -> Callable[[dict], Awaitable[None]]:
    """The store of one request's answer, once it is complete. ``still_valid``: asked first; False
    (the key revoked or the tenant deleted while the request ran: its entries were purged) stores
    nothing."""
    async def store(response: dict) -> None:
        if still_valid is not None and not await still_valid():
            return
        await cache.store(namespace, body, response, policy)

    return store
