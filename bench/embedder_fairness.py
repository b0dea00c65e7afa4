"""One tenant's bulk embeddings against another tenant's small requests on the one embedder thread.

Every tenant's semantic-cache lookups and ``/v1/embeddings`` run on one MiniLM thread per process.
A *heavy* tenant runs ``--heavy`` clients, each sending batches of ``--batch`` passages of
``--chars`` characters one after the other (as ``/v1/embeddings`` does: the tokens counted, then
the vectors); a *light* tenant sends one short text every ``--every`` seconds, and with the cache on
a chat's lookup (``Embedder.embed``) is made at the same pace. The light tenant's latencies and the
heavy tenant's throughput are measured for this tree and for ``--baseline-rev`` (its
``cache/embedder.py`` and ``gateway/embedder.py`` loaded from git), phases alternated, in one
process:

- ``cache on``: ``/v1/embeddings`` served by the cache's embedder (``SharedEmbedder``), as by default;
- ``cache off``: the gateway's own embedder (``gateway.embedder.Embedder``).

    .venv/bin/python bench/embedder_fairness.py [--seconds 12] [--rounds 2] [--baseline-rev bde5b89]
    .venv/bin/python bench/embedder_fairness.py --every 0    # the heavy tenant alone: its throughput
    .venv/bin/python bench/embedder_fairness.py --idle 400   # one text at a time, nothing else
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.usage_row import load_revision  # noqa: E402


def _call(fn, *args, share, **kw):  # noqa: ANN001, ANN202 - the baseline's methods take no share
    if "share" in inspect.signature(fn).parameters:
        kw["share"] = share
    return fn(*args, **kw)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def phase(front, lookup, args) -> dict:  # noqa: ANN001
    """``front``: the /v1/embeddings side (``acount_tokens``, ``aembed``); ``lookup``: a cache
    lookup's ``embed`` or None."""
    words = "the river carries silt to the delta where the tide spreads it over wide flats".split()
    passage = " ".join(words[i % len(words)] for i in range(args.chars // 5))[: args.chars]
    stop = time.perf_counter() + args.seconds
    heavy_texts = [0]
    light: list[float] = []
    lookups: list[float] = []
    n = [0]
    tag = os.urandom(4).hex()  # texts no earlier phase embedded (the embedders remember texts)

    async def heavy(j: int) -> None:
        k = 0
        while time.perf_counter() < stop:
            texts = [f"{j} {k} {i} {tag} {passage}" for i in range(args.batch)]
            k += 1
            await _call(front.acount_tokens, texts, stop_over=256, share="heavy")
            await _call(front.aembed, texts, share="heavy")
            heavy_texts[0] += len(texts)

    async def one_light() -> None:
        n[0] += 1
        t0 = time.perf_counter()
        text = [f"a short question number {n[0]} {tag}"]
        await _call(front.acount_tokens, text, stop_over=256, share="light")
        await _call(front.aembed, text, share="light")
        light.append((time.perf_counter() - t0) * 1000)

    async def one_lookup() -> None:
        n[0] += 1
        t0 = time.perf_counter()
        await lookup(f"how do I reset my password, try {n[0]} {tag}")
        lookups.append((time.perf_counter() - t0) * 1000)

    async def light_tenant() -> None:
        if args.every <= 0:  # the heavy tenant alone: what the short parts cost its throughput
            return
        await asyncio.sleep(0.5)  # the heavy tenant's batches queued first
        pending = []
        while time.perf_counter() < stop:
            pending.append(asyncio.ensure_future(one_light()))
            if lookup is not None:
                pending.append(asyncio.ensure_future(one_lookup()))
            await asyncio.sleep(args.every)
        await asyncio.gather(*pending)

    t0 = time.perf_counter()
    await asyncio.gather(light_tenant(), *(heavy(j) for j in range(args.heavy)))
    wall = time.perf_counter() - t0
    return {"light": light, "lookups": lookups, "heavy_tps": heavy_texts[0] / wall}


async def idle_lookups(sides: dict, n: int) -> None:
    """One text at a time on an idle embedder: a chat's lookup (cache on) and a one-text
    ``/v1/embeddings`` without the cache (what a request pays for the turns, and for the forward):
    this tree and the baseline alternated in blocks of 20, unique texts."""
    tag = os.urandom(4).hex()
    for config in ("cache on", "cache off"):
        lat: dict[str, list[float]] = {"this": [], "baseline": []}
        for block in range(n // 20):
            for name in (("this", "baseline") if block % 2 == 0 else ("baseline", "this")):
                front, lookup = sides[name][config]
                for i in range(20):
                    text = f"what is the capital of country {block} {i} {name} {tag}?"
                    t0 = time.perf_counter()
                    if lookup is not None:
                        await lookup(text)
                    else:
                        await _call(front.aembed, [text], share="light")
                    lat[name].append((time.perf_counter() - t0) * 1000)
        this, base = pct(lat["this"], .5), pct(lat["baseline"], .5)
        what = "lookups (cache on)" if config == "cache on" else "one-text embeddings (cache off)"
        print(f"idle {what}, {len(lat['this'])} each: p50 this {this:.2f} ms, baseline {base:.2f} ms, "
              f"baseline / this {base / this:.2f}x; p99 this {pct(lat['this'], .99):.2f} ms, "
              f"baseline {pct(lat['baseline'], .99):.2f} ms", flush=True)


async def main(args) -> None:  # noqa: ANN001
    import cache.embedder as this_cache
    import gateway.embedder as this_gateway

    base_cache = load_revision(args.baseline_rev, "cache/embedder.py", "fair_base_cache_embedder")
    base_gateway = load_revision(args.baseline_rev, "gateway/embedder.py", "fair_base_gateway_embedder")
    sides = {}
    for name, cmod, gmod in (("this", this_cache, this_gateway), ("baseline", base_cache, base_gateway)):
        inner = cmod.Embedder()
        shared = await gmod.SharedEmbedder.load(inner)
        alone = await asyncio.to_thread(gmod.Embedder)
        await inner.warmup()
        await alone.aembed(["warm up"])
        sides[name] = {"cache on": (shared, inner.embed), "cache off": (alone, None)}
    if args.idle:
        await idle_lookups(sides, args.idle)
        return
    light = f"one text every {args.every * 1000:.0f} ms" if args.every > 0 else "none"
    print(f"heavy tenant: {args.heavy} clients x {args.batch} passages of {args.chars} characters; "
          f"light tenant: {light}; {args.seconds:.0f} s a phase, "
          f"{args.rounds} rounds; baseline {args.baseline_rev}", flush=True)
    for config in ("cache on", "cache off"):
        got = {"this": [], "baseline": []}
        for r in range(args.rounds):
            for name in (("this", "baseline") if r % 2 == 0 else ("baseline", "this")):
                front, lookup = sides[name][config]
                got[name].append(await phase(front, lookup, args))
                res = got[name][-1]
                print(f"  {config:9s} round {r + 1} {name:8s}: light p50 {pct(res['light'], .5):7.1f} ms "
                      f"p99 {pct(res['light'], .99):7.1f} ms" + (
                          f", lookups p50 {pct(res['lookups'], .5):7.1f} ms p99 {pct(res['lookups'], .99):7.1f} ms"
                          if res["lookups"] else "") + f", heavy {res['heavy_tps']:6.1f} texts/s", flush=True)
        print(f"{config}:")
        for what in ("light", "lookups"):
            this = [x for res in got["this"] for x in res[what]]
            base = [x for res in got["baseline"] for x in res[what]]
            if not this or not base:
                continue
            label = "light tenant's embeddings" if what == "light" else "cache lookups"
            for q, qn in ((0.5, "p50"), (0.99, "p99")):
                b, t = pct(base, q), pct(this, q)
                print(f"  {label:26s} {qn}: this {t:8.1f} ms, baseline {b:8.1f} ms, baseline / this {b / t:6.2f}x")
        tps_this = statistics.mean(res["heavy_tps"] for res in got["this"])
        tps_base = statistics.mean(res["heavy_tps"] for res in got["baseline"])
        print(f"  heavy tenant's throughput: this {tps_this:.1f} texts/s, baseline {tps_base:.1f} texts/s, "
              f"this / baseline {tps_this / tps_base:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--heavy", type=int, default=4, help="the heavy tenant's concurrent clients")
    ap.add_argument("--batch", type=int, default=64, help="passages per heavy request")
    ap.add_argument("--chars", type=int, default=600, help="characters per passage")
    ap.add_argument("--every", type=float, default=0.1,
                    help="seconds between the light tenant's requests (0: no light tenant)")
    ap.add_argument("--idle", type=int, default=0,
                    help="only time this many single texts on an idle embedder (a lookup, a cache-off embedding)")
    ap.add_argument("--baseline-rev", default="bde5b89")
    asyncio.run(main(ap.parse_args()))
