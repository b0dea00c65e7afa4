"""SemanticCache: the two-tier cache behind ``cache.api.SemanticCacheClient``.

lookup:  policy gate (enabled, deterministic, no-cache)
         -> exact tier: HGET of the entry keyed by the canonical request's hash
            (pipelined with the tenant's change-log read when the index is in-process)
         -> semantic tier: embed the final user message (its shorthand written out, a request's
            framing off: ``cache.shorthand.for_embedding``; the verifier reads it as sent), k
            nearest entries in the same namespace (tenant + model + earlier turns + parameters)
            with cosine >= threshold,
            then the hard-negative verifier; the first candidate that passes is served.
            A message longer than the embedder reads gets no semantic tier (miss "too-long"),
            nor does one the verifier cannot read or the embedder cannot see: not English, in
            Latin letters, or with a letter the model's vocabulary lacks (miss
            "unsupported-text"; ``Verifier.reads``, ``Embedder.sees``).
         The result says whether the answer may be stored (a miss, or a no-cache bypass).
store:   same gate (plus no-store), embed, one atomic script: entry + TTL + cap eviction + log.
         A message with no semantic tier is stored without a vector (exact tier only).

The reading of the texts (the shorthand written out, ``Verifier.reads``, the guards' checks of
the candidates) runs on the cache's own reader thread, one hop a step, never on the event loop: a
fresh pair of questions costs the guards 1.5-2 ms, a pair of 1,000-character prompts 15-20 ms,
which would stall every other request of the process that long (the gateway's GIL switch interval
hands the loop the GIL back within 1 ms). The verifier is used from that thread alone.

Redis failures never escape: lookup answers bypass("redis-down"), store drops the entry; both
log (at most once per ``_LOG_EVERY_S``) and count. redis-py reconnects by itself, so the cache
recovers as soon as Redis answers again; in-process indexes are reloaded after an error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from cache.api import CacheLookup, CachePolicy
from cache.canonical import CanonicalRequest, canonicalize
from cache.embedder import Embedder
from cache.ft_index import QueryEngineIndex, has_query_engine
from cache.local_index import Candidate, LocalIndex
from cache.shorthand import for_embedding
from cache.stats import CacheStats
from cache.store import EntryStore, NewEntry, TenantKeys
from cache.verifier import Verifier

log = logging.getLogger("pagegate.cache")

_LOG_EVERY_S = 10.0
_TOP_K = 4
_REDIS_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
_STORABLE_FINISH = {"stop", "length"}
_T = TypeVar("_T")


class CacheClosed(Exception):
    """The cache was closed (the gateway stops) while a lookup or store was under way: a bypass."""


def bytes_client(redis: Redis) -> Redis:
    """The same server through a client that returns bytes (vectors are binary)."""
    pool = getattr(redis, "connection_pool", None)
    if pool is None or not pool.connection_kwargs.get("decode_responses"):
        return redis
    kwargs = dict(pool.connection_kwargs, decode_responses=False)
    return Redis(connection_pool=type(pool)(connection_class=pool.connection_class,
                                            max_connections=pool.max_connections, **kwargs))


class SemanticCache:
    def __init__(self, redis: Redis, embedder: Embedder, *, prefix: str = "pg:",
                 verifier: Verifier | None = None, index: str = "auto", op_timeout_s: float = 2.0,
                 defaults: CachePolicy | None = None, owns_embedder: bool = False) -> None:
        """``index``: "auto" (Query Engine when the server has it), "ft" or "local"."""
        self.redis = bytes_client(redis)
        self._owns_client = self.redis is not redis
        self._owns_embedder = owns_embedder
        self.embedder = embedder
        self.prefix = prefix
        self.verifier = verifier if verifier is not None else Verifier()
        self.defaults = defaults or CachePolicy()
        self.store_ = EntryStore(self.redis, prefix, with_log=index != "ft")
        self._index_mode = index
        self._timeout = op_timeout_s
        self._local: LocalIndex | None = None
        self._ft: QueryEngineIndex | None = None
        self._space = ""  # the embedding model's part of the semantic namespace (``Embedder.space``)
        self._stats = CacheStats()
        self._last_log = 0.0
        # the reading of texts (see the module's docstring); one thread: the verifier's memo is its own
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-cache-read")
        self._closed = False

    # -- public API ------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        s = self._stats
        if self._local is not None:
            s.index_reloads = self._local.reloads
        return s.as_dict()

    @property
    def index_kind(self) -> str | None:
        """ "ft", "local", or None before the first Redis round trip decided it."""
        return "ft" if self._ft else "local" if self._local else None

    async def lookup(self, namespace: str, body: dict, policy: CachePolicy) -> CacheLookup:
        self._stats.lookups += 1
        if not policy.enabled:
            return self._bypass("disabled")
        req = canonicalize(namespace, body)
        if not req.deterministic:
            return self._bypass("non-deterministic")
        if policy.no_cache:  # skips the lookup, not the store
            return self._bypass("no-cache", storable=not policy.no_store)
        try:
            found = await self._lookup(namespace, req, policy)
        except CacheClosed:
            return self._bypass("closed")
        except _REDIS_ERRORS as e:
            self._redis_failed("lookup", e)
            return self._bypass("redis-down")
        found.storable = found.outcome == "miss" and not policy.no_store
        if found.storable:
            found.key = req.exact_key
        return found

    async def store(self, namespace: str, body: dict, response: dict, policy: CachePolicy) -> None:
        if not policy.enabled or policy.no_store or not _complete(response):
            self._stats.store_skips += 1
            return
        req = canonicalize(namespace, body)
        if not req.deterministic:
            self._stats.store_skips += 1
            return
        try:
            await self._store(namespace, req, response, policy)
        except CacheClosed:
            self._stats.store_skips += 1
        except _REDIS_ERRORS as e:
            self._redis_failed("store", e)

    async def store_many(self, namespace: str, items: list[tuple[dict, dict]], policy: CachePolicy) -> int:
        """Prefill: store many (body, response) pairs of one tenant in batched round trips.
        Raises on Redis errors (an admin/benchmark path, not a request path)."""
        await self._ensure_index()
        keys = self.store_.keys(namespace)
        reqs = [(canonicalize(namespace, b), r) for b, r in items]
        reqs = [(q, r) for q, r in reqs if q.deterministic and _complete(r)]
        prepared = [await self._prepare(q.query) if q.query else ("no-query", "") for q, _ in reqs]
        semantic = [why is None for why, _ in prepared]
        texts = [text for why, text in prepared if why is None]
        vecs = iter(await self.embedder.embed_many(texts, share=namespace)) if texts else iter(())
        entries = [NewEntry(q.exact_key, keys.ns(q.context_key, self._space), q.query or "", next(vecs) if s else None, r)
                   for (q, r), s in zip(reqs, semantic, strict=True)]
        for i in range(0, len(entries), 1000):
            res = await self.store_.put_many(keys, entries[i:i + 1000], ttl_s=policy.ttl_s,
                                             max_entries=policy.max_entries)
            self._stats.evictions += sum(e for e, _ in res)
        self._stats.stores += len(entries)
        return len(entries)

    async def clear(self, namespace: str) -> int:
        n = await self.store_.clear(namespace)
        if self._local is not None:
            self._local.forget_all()
        return n

    async def close(self) -> None:
        """Lookups and stores after this are bypassed ("closed"); a reading already queued still runs
        (a cancelled one would raise CancelledError in a request nobody cancelled: a review's find)."""
        self._closed = True
        self._reader.shutdown(wait=False)
        if self._owns_client:
            await self.redis.aclose()
        if self._owns_embedder:
            self.embedder.close()

    # -- tiers -----------------------------------------------------------------------------
    async def _lookup(self, namespace: str, req: CanonicalRequest, policy: CachePolicy) -> CacheLookup:
        await self._ensure_index()
        keys = self.store_.keys(namespace)
        events = None
        if self._local is not None and req.query and (args := self._local.log_read_args(keys)):
            # (``async with``: a pipeline cut by the timeout gives its connection back; found by a
            # faults QA, abandoned ones logged "Unclosed Pipeline client" errors while Redis hung)
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hget(keys.entry(req.exact_key), "resp")
                pipe.xrange(args[0], args[1], "+", count=1000)
                raw, events = await self._io(pipe.execute())
        else:
            raw = await self._io(self.redis.hget(keys.entry(req.exact_key), "resp"))
        stale = False
        if raw is not None and policy.max_age_s is not None and not await self._fresh(keys, req.exact_key, policy):
            raw, stale = None, True  # older than the request allows: a paraphrase stored since may do
        if raw is not None:
            answer = _answer(raw)
            if answer is None:
                log.warning("cache entry %s holds no answer the gateway can serve: a miss, replaced by "
                            "the new answer", req.exact_key)
                return self._miss("unreadable-entry")
            self._stats.hits += 1
            return CacheLookup("hit", 1.0, answer)
        if not req.query:
            return self._miss("stale" if stale else "no-semantic-tier")
        try:
            unsearchable, text = await self._prepare(req.query)
        except CacheClosed:
            raise
        except Exception as e:  # noqa: BLE001 - a broken embedder must not fail requests
            return self._embed_failed(e)
        if unsearchable:
            return self._miss("stale" if stale else unsearchable)
        found = await self._semantic(keys, req, text, events, policy)
        if stale and found.outcome == "miss":
            found.reason = "stale"
        return found

    async def _semantic(self, keys: TenantKeys, req: CanonicalRequest, text: str, events: list | None,
                        policy: CachePolicy) -> CacheLookup:
        """``text``: the query as it is embedded (``_prepare``)."""
        ns = keys.ns(req.context_key, self._space)
        if self._local is not None:
            tenant = await self._io(self._local.sync(keys, events), slow=True)  # a first load may be big
            if ns not in tenant.spaces:  # nothing to compare with: skip the embedding
                return self._miss("below-threshold")
        try:
            vec = await self.embedder.embed(text)
        except Exception as e:  # noqa: BLE001 - a broken embedder must not fail requests
            return self._embed_failed(e)
        if self._local is not None:
            candidates = self._local.search(keys, ns, vec, _TOP_K, policy.threshold)
        else:
            candidates = await self._io(self._ft.search(ns, vec, _TOP_K, policy.threshold))
        if not candidates:
            return self._miss("below-threshold")
        rejected = stale = i = 0
        while i < len(candidates):
            refused = await self._read(_refused_before_one, self.verifier, req.query,
                                       [c.text for c in candidates[i:]])
            rejected += refused
            i += refused
            if i == len(candidates):
                break
            cand = candidates[i]
            i += 1
            if policy.max_age_s is not None and not await self._fresh(keys, cand.entry_id, policy):
                stale += 1
                continue
            resp = _answer(await self._response(keys, cand))
            if resp is not None:
                self._stats.semantic_hits += 1
                return CacheLookup("semantic-hit", round(cand.score, 4), resp)
        self._stats.verifier_rejections += rejected
        return self._miss("verifier" if rejected else "stale" if stale else "expired")

    async def _fresh(self, keys: TenantKeys, entry_id: str, policy: CachePolicy) -> bool:
        """Whether the entry was stored at most ``policy.max_age_s`` ago, on Redis's clock (the
        store script stamps it from ``TIME``); an entry without a stamp is not."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zscore(keys.stored, entry_id)
            pipe.time()
            stored_ms, (sec, usec) = await self._io(pipe.execute())
        if stored_ms is None:
            return False
        return sec * 1000 + usec / 1000 - float(stored_ms) <= policy.max_age_s * 1000

    async def _prepare(self, text: str) -> tuple[str | None, str]:
        """Why ``text`` gets no semantic tier (or None), and the text to embed for it (its shorthand
        written out, its framing off: ``cache.shorthand.for_embedding``). "too-long": the embedder reads only a long
        text's beginning, so two long prompts that differ after it would get one vector, and one the
        other's answer. "unsupported-text": a text the guards cannot read (another script or
        language), or with letters the embedder does not see, would be served the answer of another
        with the same shape."""
        if not await self.embedder.fits(text):
            return "too-long", ""
        embedded = await self._read(_read_for_embedding, self.verifier, text)
        if embedded is None or not await self.embedder.sees(text):
            return "unsupported-text", ""
        return None, embedded

    async def _response(self, keys: TenantKeys, cand: Candidate) -> dict | None:
        if cand.response is not None:
            return cand.response
        resp = await self._io(self.store_.get_response(keys, cand.entry_id))
        if resp is None and self._local is not None:
            self._local.drop_entry(keys, cand.entry_id)  # expired before its log event
        return resp

    async def _store(self, namespace: str, req: CanonicalRequest, response: dict, policy: CachePolicy) -> None:
        await self._ensure_index()
        vec = None
        if req.query:
            try:
                unsearchable, text = await self._prepare(req.query)
                if unsearchable is None:  # else exact tier only
                    vec = await self.embedder.embed(text)
            except CacheClosed:
                raise
            except Exception as e:  # noqa: BLE001
                self._embed_failed(e)
        keys = self.store_.keys(namespace)
        entry = NewEntry(req.exact_key, keys.ns(req.context_key, self._space), req.query or "", vec, response)
        evicted, _ = await self._io(
            self.store_.put(keys, entry, ttl_s=policy.ttl_s, max_entries=policy.max_entries))
        self._stats.stores += 1
        self._stats.evictions += evicted

    async def _ensure_index(self) -> None:
        if self._local is not None or self._ft is not None:
            return
        await self.embedder.ready()
        dim = self.embedder.dim
        self._space = getattr(self.embedder, "space", "")  # (read by ``ready`` on the embedder's thread)
        if not self.verifier.has_vocab:  # (on the reader: its memo is cleared)
            await self._read(self.verifier.set_vocab, await self.embedder.read_vocab())
        mode = self._index_mode
        if mode == "auto":
            mode = "ft" if await self._io(has_query_engine(self.redis)) else "local"
        if mode == "ft":
            ft = QueryEngineIndex(self.redis, self.prefix, dim, self._space)
            await self._io(ft.ensure())
            self._ft = ft
            self.store_.with_log = False
        else:
            self._local = LocalIndex(self.redis, dim)

    async def _read(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the reader thread (see the module's docstring); ``CacheClosed`` once the
        cache is closed."""
        if self._closed:
            raise CacheClosed
        try:
            return await asyncio.get_running_loop().run_in_executor(self._reader, fn, *args)
        except RuntimeError:
            if self._closed:  # (shut down since the check: "cannot schedule new futures")
                raise CacheClosed from None
            raise

    async def _io(self, aw, *, slow: bool = False):
        """A Redis round trip under the cache's deadline (a hung Redis must not hang requests)."""
        return await asyncio.wait_for(aw, self._timeout * (10 if slow else 1))

    # -- outcomes --------------------------------------------------------------------------
    def _bypass(self, reason: str, *, storable: bool = False) -> CacheLookup:
        self._stats.bypasses += 1
        return CacheLookup("bypass", reason=reason, storable=storable)

    def _miss(self, reason: str) -> CacheLookup:
        self._stats.misses += 1
        return CacheLookup("miss", reason=reason)

    def _embed_failed(self, e: Exception) -> CacheLookup:
        self._stats.embed_errors += 1
        log.warning("cache embedder failed: %s", e)
        return self._miss("embedder-error")

    def _redis_failed(self, op: str, e: BaseException) -> None:
        self._stats.redis_errors += 1
        if self._local is not None:
            self._local.forget_all()  # Redis may come back empty: reload what we serve from
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            # (a bare timeout has no text of its own: found by a faults QA, "TimeoutError: ")
            log.error("semantic cache %s failed, serving without cache: %s: %s",
                      op, type(e).__name__, str(e) or "no answer in time")


def _read_for_embedding(verifier: Verifier, text: str) -> str | None:
    """The text to embed for ``text``, or None where the guards cannot read it (reader thread)."""
    return for_embedding(text) if verifier.reads(text) else None


def _refused_before_one(verifier: Verifier, query: str, candidates: list[str]) -> int:
    """How many of ``candidates``, in order, the verifier refuses before one it passes (all of
    them if none passes); on the reader thread."""
    for i, text in enumerate(candidates):
        if verifier.check(query, text).ok:
            return i
    return len(candidates)


def _answer(raw: bytes | str | dict | None) -> dict | None:
    """A stored answer in the shape the gateway replays (``choices`` of finished messages or texts,
    integer ``usage``), or None for anything else: foreign or corrupt data in Redis (another
    version sharing it, a hand edit) is a miss whose new answer replaces it, never a failed request
    (found by QA: ``[]`` stored as an answer gave a 500)."""
    try:
        resp = json.loads(raw) if isinstance(raw, bytes | str) else raw
    except ValueError:
        return None
    if not isinstance(resp, dict) or not isinstance(resp.get("choices"), list) or not resp["choices"]:
        return None
    for c in resp["choices"]:
        if not isinstance(c, dict) or c.get("finish_reason") not in _STORABLE_FINISH:
            return None
        message = c.get("message")
        if message and not isinstance(message, dict):  # (replay reads a message that is there as one)
            return None
        text = message.get("content") if isinstance(message, dict) else c.get("text")
        if not isinstance(text, str) or not isinstance(c.get("index", 0), int):
            return None
    usage = resp.get("usage")
    if usage is not None and (not isinstance(usage, dict) or not all(
            isinstance(usage.get(k, 0), int) and not isinstance(usage.get(k, 0), bool) and usage.get(k, 0) >= 0
            for k in ("prompt_tokens", "completion_tokens"))):
        return None
    return resp


def _complete(response: dict) -> bool:
    """A whole answer: every choice finished normally (never a partial or aborted stream)."""
    choices = response.get("choices") or []
    return bool(choices) and all(c.get("finish_reason") in _STORABLE_FINISH for c in choices)

