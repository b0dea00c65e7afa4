"""The semantic cache's contract with the gateway. ``cache/`` knows nothing of HTTP or the
database: it takes a namespace (the tenant), the OpenAI request body and a policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Outcome = Literal["hit", "semantic-hit", "miss", "bypass"]


@dataclass(slots=True)
class CachePolicy:
    """Per-tenant settings plus the request's Cache-Control directives."""

    enabled: bool = True
    threshold: float = 0.90  # cosine similarity for the semantic tier
    ttl_s: int = 86_400
    max_entries: int = 10_000
    no_cache: bool = False  # Cache-Control: no-cache -> skip lookup
    no_store: bool = False  # Cache-Control: no-store -> do not store
    max_age_s: int | None = None  # Cache-Control: max-age=N (N > 0) -> serve only answers stored N s ago or less


@dataclass(slots=True)
class CacheLookup:
    outcome: Outcome
    similarity: float | None = None  # 1.0 for exact hits
    response: dict | None = None  # the stored OpenAI response body (non-streaming shape), on hits
    reason: str | None = None  # why bypass/miss (e.g. "non-deterministic", "redis-down", "verifier")
    storable: bool = False  # store() would keep this request's complete answer: a miss, or a
    # no-cache bypass of a cacheable request, without no-store
    key: str | None = None  # a storable miss's exact key in its namespace (identical requests share it)


class SemanticCacheClient(Protocol):
    async def lookup(self, namespace: str, body: dict, policy: CachePolicy) -> CacheLookup:
        """``body`` is the validated chat-completions request (dict). Never raises on Redis
        errors: returns a bypass with reason "redis-down" and logs/counts the error. The
        caller stores the answer (``store``) only when the result is ``storable``."""

    async def store(self, namespace: str, body: dict, response: dict, policy: CachePolicy) -> None:
        """Store a complete (non-partial) response; a no-op when not cacheable or no_store."""

    def stats(self) -> dict[str, int]:
        """Counters since start: lookups, hits, semantic_hits, misses, bypasses,
        verifier_rejections, stores, evictions, redis_errors, ..."""

    async def close(self) -> None: ...
