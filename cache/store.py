"""Cache entries in Redis: one hash per entry, a per-tenant sorted set for TTL and eviction, and
a per-tenant change log that in-process indexes tail. All keys of one tenant share a hash tag,
so every multi-key step is one atomic script on one Redis Cluster slot.

    {prefix}cache:{T}:e:<exact_key>   hash  resp (JSON) · text · vec (float32) · ns · exp   PEXPIRE ttl
    {prefix}cache:{T}:z               zset  exact_key -> expiry time (ms): what has expired, and the count
    {prefix}cache:{T}:t               zset  exact_key -> time stored (ms; 1 after the newest when that is
                                            not earlier): the cap evicts the oldest first
    {prefix}cache:{T}:log             stream  s (sequence) · op add|del · id [· ns · text · vec]
    {prefix}cache:{T}:seq             string  last sequence number written to the log

T = a hash of the tenant namespace. ns = T + the embedding model's space ("" for the bundled one) +
the request's context key (the semantic namespace).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
from redis.asyncio import Redis

LOG_MAXLEN = 1000  # events kept per tenant; a reader further behind reloads the tenant

_STORE_LUA = """
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local eprefix, id, ns, text, vec, resp = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local ttl, cap, maxlen = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local function log(op, eid, ens, etext, evec)
  if maxlen <= 0 then return end
  local s = redis.call('INCR', KEYS[4])
  if op == 'add' then
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', maxlen, '*', 's', s, 'op', op, 'id', eid,
               'ns', ens, 'text', etext, 'vec', evec)
  else
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', maxlen, '*', 's', s, 'op', op, 'id', eid)
  end
end
redis.call('DEL', KEYS[1])
if vec == '' then  -- no semantic tier: no vector field (the Query Engine would reject an empty one)
  redis.call('HSET', KEYS[1], 'resp', resp, 'text', text, 'ns', ns, 'exp', now + ttl)
else
  redis.call('HSET', KEYS[1], 'resp', resp, 'text', text, 'vec', vec, 'ns', ns, 'exp', now + ttl)
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now + ttl, id)
-- strictly after the newest stored (two stores in one millisecond keep their order)
local newest = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
local at = now
if #newest == 2 and tonumber(newest[2]) >= at then at = tonumber(newest[2]) + 1 end
redis.call('ZADD', KEYS[5], at, id)
log('add', id, ns, text, vec)
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)
for _, eid in ipairs(expired) do
  redis.call('ZREM', KEYS[2], eid)
  redis.call('ZREM', KEYS[5], eid)
  redis.call('DEL', eprefix .. eid)
  log('del', eid)
end
local evicted = 0
local n = redis.call('ZCARD', KEYS[2])
if redis.call('ZCARD', KEYS[5]) < n then
  -- entries from before the store-time set existed (once per tenant): older than any tracked
  -- one, in the order they expire
  local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do redis.call('ZADD', KEYS[5], 'NX', tonumber(all[i + 1]) - 1e13, all[i]) end
end
if n > cap then
  -- the oldest stored first (by expiry instead, a tenant whose TTL was lowered would evict each
  -- new entry at once while its older, longer-lived ones stayed)
  local popped = redis.call('ZPOPMIN', KEYS[5], n - cap)
  for i = 1, #popped, 2 do
    redis.call('ZREM', KEYS[2], popped[i])
    redis.call('DEL', eprefix .. popped[i])
    log('del', popped[i])
    evicted = evicted + 1
  end
end
for i = 2, 5 do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return {evicted, #expired}
"""


def tenant_tag(namespace: str) -> str:
    return hashlib.blake2b(namespace.encode(), digest_size=8).hexdigest()


@dataclass(slots=True, frozen=True)
class TenantKeys:
    tag: str
    base: str  # "{prefix}cache:{tag}:"

    @classmethod
    def of(cls, prefix: str, namespace: str) -> TenantKeys:
        tag = tenant_tag(namespace)
        return cls(tag, f"{prefix}cache:{{{tag}}}:")

    @property
    def entry_prefix(self) -> str:
        return self.base + "e:"

    def entry(self, entry_id: str) -> str:
        return self.base + "e:" + entry_id

    @property
    def zset(self) -> str:
        return self.base + "z"

    @property
    def stored(self) -> str:
        return self.base + "t"

    @property
    def log(self) -> str:
        return self.base + "log"

    @property
    def seq(self) -> str:
        return self.base + "seq"

    def ns(self, context_key: str, space: str = "") -> str:
        """The semantic namespace; ``space``: the embedding model's (``Embedder.space``)."""
        return self.tag + space + context_key


@dataclass(slots=True)
class NewEntry:
    entry_id: str  # the exact key
    ns: str  # tenant tag + context key
    text: str  # the final user message ("" when the request has no semantic tier)
    vec: np.ndarray | None  # normalised float32, None without a semantic tier
    response: dict


class EntryStore:
    """Reads and writes entries. Raises redis errors: the caller decides what a failure means."""

    def __init__(self, redis: Redis, prefix: str, *, with_log: bool = True) -> None:
        self.redis = redis
        self.prefix = prefix
        self.with_log = with_log
        self._script = redis.register_script(_STORE_LUA)

    def keys(self, namespace: str) -> TenantKeys:
        return TenantKeys.of(self.prefix, namespace)

    async def get_response(self, keys: TenantKeys, entry_id: str) -> dict | None:
        """The stored answer, or None (gone; or not JSON: ``semantic_cache._answer`` judges the rest)."""
        raw = await self.redis.hget(keys.entry(entry_id), "resp")
        try:
            return None if raw is None else json.loads(raw)
        except ValueError:
            return None

    async def put(self, keys: TenantKeys, e: NewEntry, *, ttl_s: int, max_entries: int) -> tuple[int, int]:
        """Store one entry; returns (evicted for the cap, expired cleaned up)."""
        return (await self.put_many(keys, [e], ttl_s=ttl_s, max_entries=max_entries))[0]

    async def put_many(self, keys: TenantKeys, entries: list[NewEntry], *, ttl_s: int,
                       max_entries: int) -> list[tuple[int, int]]:
        """Store many entries of one tenant in one pipelined round trip (prefill, benchmarks)."""
        async with self.redis.pipeline(transaction=False) as pipe:  # (cut short: its connection given back)
            for e in entries:
                vec = b"" if e.vec is None else np.asarray(e.vec, np.float32).tobytes()
                args = [keys.entry_prefix, e.entry_id, e.ns, e.text, vec, json.dumps(e.response),
                        max(1, int(ttl_s * 1000)), max(1, max_entries), LOG_MAXLEN if self.with_log else 0]
                await self._script(keys=[keys.entry(e.entry_id), keys.zset, keys.log, keys.seq, keys.stored],
                                   args=args, client=pipe)
            res = await pipe.execute()
        return [(int(r[0]), int(r[1])) for r in res]

    async def count(self, keys: TenantKeys) -> int:
        return int(await self.redis.zcard(keys.zset))

    async def clear(self, namespace: str) -> int:
        """Delete every entry of a tenant (admin, tests)."""
        keys = self.keys(namespace)
        n = 0
        async for k in self.redis.scan_iter(match=keys.base + "*", count=1000):
            n += await self.redis.delete(k)
        return n
