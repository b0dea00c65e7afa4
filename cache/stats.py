"""Counters of one cache instance (exposed by ``SemanticCache.stats()``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class CacheStats:
    lookups: int = 0
    hits: int = 0
    semantic_hits: int = 0
    misses: int = 0
    bypasses: int = 0
    verifier_rejections: int = 0
    stores: int = 0
    store_skips: int = 0
    evictions: int = 0
    redis_errors: int = 0
    embed_errors: int = 0
    index_reloads: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
