"""Vector search by the Redis Query Engine (Redis Stack, Redis 8, or a managed Redis with
search): one HNSW index over every entry hash under ``{prefix}cache:``, filtered by the
entry's ``ns`` tag (tenant + semantic namespace), so a KNN query never crosses tenants.

    FT.CREATE {prefix}cache-idx ON HASH PREFIX 1 {prefix}cache:
        SCHEMA ns TAG vec VECTOR HNSW 6 TYPE FLOAT32 DIM 384 DISTANCE_METRIC COSINE
    FT.SEARCH {prefix}cache-idx "@ns:{<ns>}=>[KNN k @vec $B AS d]" PARAMS 2 B <vec> ... DIALECT 2
"""

from __future__ import annotations

import json

import numpy as np
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from cache.local_index import Candidate


async def has_query_engine(redis: Redis) -> bool:
    """True when the server answers FT._LIST (the Query Engine is loaded)."""
    try:
        await redis.execute_command("FT._LIST")
        return True
    except ResponseError:
        return False


class QueryEngineIndex:
    def __init__(self, redis: Redis, prefix: str, dim: int, space: str = "") -> None:
        """``space``: the embedding model's (``Embedder.space``); another model gets an index of its
        own (the index's DIM is fixed, and a query of another size is an error)."""
        self.redis = redis
        self.name = f"{prefix}cache-idx" + (f"-{space}" if space else "")
        self.prefix = f"{prefix}cache:"
        self.dim = dim
        self._ready = False

    async def ensure(self) -> None:
        if self._ready:
            return
        try:
            await self.redis.execute_command("FT.INFO", self.name)
        except ResponseError:
            try:
                await self.redis.execute_command(
                    "FT.CREATE", self.name, "ON", "HASH", "PREFIX", 1, self.prefix,
                    "SCHEMA", "ns", "TAG", "vec", "VECTOR", "HNSW", 6, "TYPE", "FLOAT32",
                    "DIM", self.dim, "DISTANCE_METRIC", "COSINE")
            except ResponseError as e:
                if "already exists" not in str(e).lower():
                    raise
        self._ready = True

    async def search(self, ns: str, vec: np.ndarray, k: int, min_score: float) -> list[Candidate]:
        await self.ensure()
        query = f"@ns:{{{ns}}}=>[KNN {k} @vec $B AS d]"
        reply = await self.redis.execute_command(
            "FT.SEARCH", self.name, query, "PARAMS", 2, "B", np.asarray(vec, np.float32).tobytes(),
            "SORTBY", "d", "RETURN", 3, "d", "text", "resp", "LIMIT", 0, k, "DIALECT", 2)
        out: list[Candidate] = []
        for i in range(1, len(reply), 2):
            key = reply[i].decode() if isinstance(reply[i], bytes) else reply[i]
            raw = reply[i + 1]
            f = {(raw[j].decode() if isinstance(raw[j], bytes) else raw[j]): raw[j + 1]
                 for j in range(0, len(raw), 2)}
            score = 1.0 - float(f["d"])
            if score < min_score or "resp" not in f:
                continue
            text = f.get("text", b"")
            try:
                resp = json.loads(f["resp"])
            except ValueError:  # not JSON: no answer to serve (``semantic_cache._answer`` skips it)
                resp = None
            out.append(Candidate(key.rsplit(":", 1)[-1], score,
                                 text.decode() if isinstance(text, bytes) else text, resp))
        return out
