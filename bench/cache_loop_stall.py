"""How long a semantic-cache lookup holds the event loop: the reading of texts on the cache's
reader thread (as shipped) against the same lookups with that reading on the loop (the code before
the reader thread; here a subclass whose ``_read`` calls the function in place), in one process,
alternated, against real Redis (DB 4, a unique prefix, removed afterwards).

Each lookup asks a new question close to a stored one (the stored prompt with one number changed,
so the embedding finds it and the verifier reads the pair and refuses it), while a ticker on the
loop sleeps 1 ms again and again and records how late each sleep ends. ``--chars`` sets the length
of the prompts (the embedder reads about 1,000 characters of one whole; a longer one has no
semantic tier). The switch interval is the gateway's (1 ms, ``gil_switch_interval_ms``), and so is
the frozen heap (``gc.freeze`` once loaded, ``gateway/heap.py``: else a full collection, ~0.3 s
here, lands in one lookup or the other). A lookup during which a full collection still ran (the
analyses allocate) is left out of the stall figures and counted apart, with the collection's
longest run: a stall that long is the collector's, not the reading's.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/cache_loop_stall.py [--chars 60,450,900] [--n 40]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import redis.asyncio as aioredis  # noqa: E402

from cache.api import CachePolicy  # noqa: E402
from cache.embedder import Embedder  # noqa: E402
from cache.semantic_cache import SemanticCache  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/4"
SENTENCES = [
    "My {i} pods keep restarting with CrashLoopBackOff after I upgraded the image to version {j}.",
    "The logs show an OOMKilled status even though the memory limit is set to {k} MiB.",
    "The node pool has {i} machines with {j} cores each and the cluster runs Kubernetes 1.{k}.",
    "Requests time out after {j} seconds when more than {k} users are logged in at once.",
    "We deploy with Helm and the chart sets {i} replicas behind an ingress with TLS.",
]


def prompt(n: int, chars: int, salt: int) -> str:
    """A question of about ``chars`` characters, numbered ``n``; ``salt`` changes one number."""
    head, parts, i = f"Case {n}, release {3 + salt}:", [], 0
    while sum(map(len, parts)) < chars - len(head) - 30:
        parts.append(SENTENCES[i % len(SENTENCES)].format(i=n + i, j=3 + i, k=200 + n + i))
        i += 1
    text = " ".join([head, *parts])
    if len(text) > chars - 22:  # (cut at a word)
        text = text[: max(chars - 22, len(head) + 1)].rsplit(" ", 1)[0]
    return text + " What should I change?"


def chat(text: str) -> dict:
    return {"model": "smollm2-135m-instruct", "temperature": 0, "messages": [{"role": "user", "content": text}]}


def answer(i: int) -> dict:
    return {"id": f"chatcmpl-{i}", "object": "chat.completion", "created": 0, "model": "smollm2-135m-instruct",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"Answer {i}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}}


class FullCollections:
    """The collector's full (generation 2) collections: how many, and the longest run (ms)."""

    def __init__(self) -> None:
        self.count, self.longest_ms, self._t0 = 0, 0.0, 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.longest_ms = max(self.longest_ms, (time.perf_counter() - self._t0) * 1000)

    def close(self) -> None:
        gc.callbacks.remove(self)


class InlineReading(SemanticCache):
    """The baseline: the reading runs on the event loop, as it did before the reader thread."""

    async def _read(self, fn, *args):  # noqa: ANN001, ANN202
        return fn(*args)


async def tick(gaps: list[float]) -> None:
    """Sleeps 1 ms again and again; appends how late each sleep ended (seconds)."""
    last = time.perf_counter()
    while True:
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last - 0.001)
        last = now


async def measure(cache: SemanticCache, ns: str, chars: int, n: int, first: int,
                  collections: FullCollections) -> tuple[list, list, dict, list]:
    """Stalls (ms) of the lookups without a full collection, lookup latencies (ms), outcomes, and
    the longest run (ms) of each full collection that fell in a lookup. ``first``: the number of
    the first question, so that each call reads texts never read before (the readings are
    remembered, in the process: a text read once costs little the second time)."""
    policy = CachePolicy()
    await cache.store_many(ns, [(chat(prompt(first + i, chars, 0)), answer(i)) for i in range(n)], policy)
    stalls, latencies, outcomes, collected = [], [], {}, []
    for i in range(n):
        gaps: list[float] = []
        ticker = asyncio.create_task(tick(gaps))
        await asyncio.sleep(0.005)
        full_before, collections.longest_ms = collections.count, 0.0
        t0 = time.perf_counter()
        found = await cache.lookup(ns, chat(prompt(first + i, chars, 1)), policy)
        latencies.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(0.002)
        ticker.cancel()
        if collections.count > full_before:
            collected.append(collections.longest_ms)
        else:
            stalls.append(max(gaps) * 1000)
        key = f"{found.outcome}/{found.reason}" if found.reason else found.outcome
        outcomes[key] = outcomes.get(key, 0) + 1
    return stalls, latencies, outcomes, collected


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chars", default="60,450,900")
    ap.add_argument("--n", type=int, default=40, help="lookups per length, mode and round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    sys.setswitchinterval(0.001)
    embedder = Embedder()
    await embedder.ready()
    await embedder.warmup()
    gc.freeze()
    collections = FullCollections()
    prefix = f"bench-stall-{uuid.uuid4().hex[:8]}:"
    redis = aioredis.Redis.from_url(REDIS_URL)
    caches = {"reader thread": SemanticCache(redis, embedder, prefix=prefix, index="local"),
              "on the loop": InlineReading(redis, embedder, prefix=prefix, index="local")}
    print("| prompt chars | reading | lookups | loop stall p50 ms | p99 | max | lookup p50 ms | outcomes "
          "| lookups with a full collection (its ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    try:
        for chars in (int(c) for c in args.chars.split(",")):
            results: dict[str, tuple[list, list, dict, list]] = {m: ([], [], {}, []) for m in caches}
            for r in range(args.rounds):
                for mode, cache in (caches.items() if r % 2 == 0 else reversed(caches.items())):
                    # (each mode, length and round its own tenant and questions: all read afresh)
                    first = (2 * r + (mode == "on the loop")) * args.n
                    s, lat, out, full = await measure(cache, f"t-{chars}-{r}-{mode[:2]}", chars, args.n, first,
                                                      collections)
                    results[mode][0].extend(s)
                    results[mode][1].extend(lat)
                    results[mode][3].extend(full)
                    for k, v in out.items():
                        results[mode][2][k] = results[mode][2].get(k, 0) + v
            for mode, (s, lat, out, full) in results.items():
                s = sorted(s)
                print(f"| {chars} | {mode} | {len(s)} | {statistics.median(s):.2f} | "
                      f"{s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]:.2f} | {s[-1]:.2f} | "
                      f"{statistics.median(lat):.2f} | {out} | {len(full)} "
                      f"{'(' + ', '.join(f'{x:.0f}' for x in full) + ')' if full else ''} |")
            base, new = sorted(results["on the loop"][0]), sorted(results["reader thread"][0])
            p99 = lambda xs: xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]  # noqa: E731
            print(f"|  | on the loop / reader thread | | {statistics.median(base) / statistics.median(new):.2f}x "
                  f"| {p99(base) / p99(new):.2f}x | {base[-1] / new[-1]:.2f}x | | | |")
    finally:
        async for k in redis.scan_iter(match=prefix + "*", count=1000):
            await redis.delete(k)
        for cache in caches.values():
            await cache.close()
        await redis.aclose()
        embedder.close()
        collections.close()
        gc.unfreeze()


if __name__ == "__main__":
    asyncio.run(main())
