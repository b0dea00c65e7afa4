"""pagegate's semantic cache: exact and semantic tiers over Redis, tenant-isolated, with a
hard-negative verifier. The gateway builds it with ``build_cache`` and talks to it through
``cache.api.SemanticCacheClient``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cache.api import CacheLookup, CachePolicy, SemanticCacheClient

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from cache.semantic_cache import SemanticCache


def default_policy(settings) -> CachePolicy:
    """The tenant-independent defaults from Settings (cache_* fields)."""
    return CachePolicy(enabled=settings.cache_enabled, threshold=settings.cache_threshold,
                       ttl_s=settings.cache_ttl_s, max_entries=settings.cache_max_entries)


def build_cache(settings, redis: Redis) -> SemanticCache | None:
    """The cache for ``settings`` (gateway.settings.Settings), or None when disabled.
    Cheap: the embedding model loads on first use, on the cache's worker thread."""
    if not settings.cache_enabled:
        return None
    from cache.embedder import Embedder
    from cache.semantic_cache import SemanticCache
    from cache.verifier import GUARDS, Verifier

    guards = GUARDS if settings.cache_qualifier_guard else GUARDS - {"qualifier"}
    return SemanticCache(redis, Embedder(settings.embedding_model), prefix=settings.redis_prefix,
                         verifier=Verifier(guards=guards), defaults=default_policy(settings), owns_embedder=True)


__all__ = ["CacheLookup", "CachePolicy", "SemanticCacheClient", "build_cache", "default_policy"]
