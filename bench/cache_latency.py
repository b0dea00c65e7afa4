"""Semantic-cache hit latency through HTTP, with 10,000 entries in the tenant's cache.

Starts the real gateway (create_app + uvicorn on a free port, the real SmolLM2 engine for
tokenisation, SQLite, Redis DB 4 under a unique prefix), prefills 10,000 entries for one tenant
straight through the cache's batched store API, then times POST /v1/chat/completions:

    exact hit     the same request as a cached one             (x-cache: hit)
    semantic hit  a paraphrase ("do" -> "can") of a cached one  (x-cache: semantic-hit)
    baseline      GET /v1/models on the same server: the HTTP + auth floor of this machine

and, for comparison, the same lookups straight on the cache API (no HTTP).

    .venv/bin/python bench/cache_latency.py [--entries 10000] [--n 300]

Targets on the 2-core dev machine: exact hit p50 <= 3 ms, semantic hit p50 <= 15 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REDIS_URL = "redis://127.0.0.1:6379/4"

ACTIONS = """reset configure back up restore update uninstall encrypt rename move share sync export import
    migrate monitor secure debug reinstall clean optimize""".split()
OBJECTS = """my router|the database|my laptop|a printer|my email account|the firewall|a USB drive|my phone
    |the web server|a shared folder|my calendar|the VPN client|a Git repository|my password manager
    |the mail server|a Docker container|my photo library|the DNS settings|a Python package|my browser
    |the backup disk|a virtual machine|my smart TV|the office Wi-Fi|a Bluetooth speaker|the SSH keys
    |a MySQL table|my cloud storage|the print queue|a network drive|my contacts|the audio driver
    |a web app|the log files|my keyboard layout|a cron job|the SSL certificate|my game console
    |a Slack workspace|the file server|my fitness tracker|a PDF form|the home NAS|my music library
    |a Kubernetes cluster|the company intranet|my e-reader|a shell script|the CI pipeline|my webcam"""
OBJECTS = [o.strip() for o in OBJECTS.split("|")]
PLACES = "on Linux|on Windows|on macOS|on Android|on iOS|at work|at home|remotely|for a new user|safely"
PLACES = PLACES.split("|")


def questions(n: int) -> list[tuple[str, str]]:
    """n distinct (cached question, paraphrase) pairs."""
    out = []
    for a, o, p in itertools.product(ACTIONS, OBJECTS, PLACES):
        out.append((f"How do I {a} {o} {p}?", f"How can I {a} {o} {p}?"))
        if len(out) == n:
            return out
    raise ValueError(f"at most {len(out)} questions")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def line(name: str, xs: list[float]) -> str:
    return (f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {pct(xs, 0.99):.2f} | "
            f"{statistics.fmean(xs):.2f} |")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 1800):  # noqa: ANN001, ANN201
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start(tmp: Path, prefix: str):  # noqa: ANN201
    import uvicorn

    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from gateway import tenancy
    from gateway.app import create_app
    from gateway.settings import Settings

    engine = AsyncEngine(EngineConfig(model="smollm2-135m-instruct", device="cpu", dtype="float32",
                                      num_blocks=256, max_model_len=2048, max_num_seqs=8))
    await engine.start()
    db_url = f"sqlite+aiosqlite:///{tmp}/bench.db"
    settings = Settings(database_url=db_url, redis_url=REDIS_URL, redis_prefix=prefix, data_dir=str(tmp),
                        usage_spool_dir=str(tmp / "spool"), default_rpm=10**7, default_tpm=10**9,
                        cache_enabled=True, cache_max_entries=10_000, load_engine=False, log_level="warning")
    app = create_app(settings, engine=engine)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", access_log=False))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    svc = app.state.pagegate.services
    async with svc.db.sessionmaker() as session:
        tenant = await tenancy.create_tenant(session, name=f"bench-{uuid.uuid4().hex[:6]}")
        _row, key = await tenancy.create_api_key(session, tenant_id=tenant.id)
        await session.commit()
    return dict(engine=engine, app=app, server=server, task=task, port=port, tenant_id=tenant.id,
                key=key.key, cache=app.state.pagegate.cache, settings=settings)


async def prefill(ctx: dict, pairs: list[tuple[str, str]]) -> float:
    from cache import default_policy
    from gateway.cache_glue import cache_body
    from gateway.schemas import ChatCompletionRequest

    model = ctx["engine"].model_id
    items = []
    for i, (q, _) in enumerate(pairs):
        body = cache_body(ChatCompletionRequest.model_validate(request(model, q)))
        resp = {"id": f"chatcmpl-prefill-{i}", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"Answer {i}: step one, "
                                                     "open the settings; step two, follow the prompts."},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}}
        items.append((body, resp))
    t0 = time.perf_counter()
    await ctx["cache"].store_many(str(ctx["tenant_id"]), items, default_policy(ctx["settings"]))
    return time.perf_counter() - t0


def request(model: str, text: str) -> dict:
    return {"model": model, "temperature": 0, "max_tokens": 64, "messages": [{"role": "user", "content": text}]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--n", type=int, default=300)
    args = ap.parse_args()
    import httpx
    import redis
    import torch

    torch.set_num_threads(1)  # one query per forward pass: extra threads only contend on 2 cores
    prefix = f"benchlat-{uuid.uuid4().hex[:8]}:"
    loop = LoopThread()
    tmp = Path(tempfile.mkdtemp(prefix="pagegate-bench-"))
    from gateway.db.session import upgrade_sync

    upgrade_sync(f"sqlite+aiosqlite:///{tmp}/bench.db")
    ctx = loop.run(start(tmp, prefix))
    try:
        pairs = questions(args.entries)
        took = loop.run(prefill(ctx, pairs))
        print(f"prefilled {args.entries} entries in {took:.1f} s (embedding included)")
        model = ctx["engine"].model_id
        base = f"http://127.0.0.1:{ctx['port']}"
        hdr = {"authorization": f"Bearer {ctx['key']}"}
        step = max(1, len(pairs) // (args.n + 20))
        picks = pairs[::step][: args.n + 20]
        res: dict[str, list[float]] = {"baseline GET /v1/models": [], "exact hit": [], "semantic hit": []}
        outcomes: dict[str, dict[str, int]] = {"exact hit": {}, "semantic hit": {}}
        with httpx.Client(base_url=base, headers=hdr, timeout=60) as client:
            for i, (q, para) in enumerate(picks):
                for name, text in (("exact hit", q), ("semantic hit", para)):
                    t0 = time.perf_counter()
                    r = client.post("/v1/chat/completions", json=request(model, text))
                    dt = (time.perf_counter() - t0) * 1000
                    assert r.status_code == 200, r.text
                    got = r.headers.get("x-cache", "?")
                    if i >= 20:  # the first 20 of each are warm-up
                        res[name].append(dt)
                        outcomes[name][got] = outcomes[name].get(got, 0) + 1
                t0 = time.perf_counter()
                client.get("/v1/models")
                if i >= 20:
                    res["baseline GET /v1/models"].append((time.perf_counter() - t0) * 1000)

        async def api_level() -> dict[str, list[float]]:
            from cache import default_policy
            from gateway.cache_glue import cache_body
            from gateway.schemas import ChatCompletionRequest

            cache, ns, pol = ctx["cache"], str(ctx["tenant_id"]), default_policy(ctx["settings"])
            out: dict[str, list[float]] = {"cache API exact": [], "cache API semantic": [],
                                           "  of which: embedding alone": []}
            for q, para in picks[20:]:
                for name, text in (("cache API exact", q), ("cache API semantic", para + " ")):
                    body = cache_body(ChatCompletionRequest.model_validate(request(model, text)))
                    t0 = time.perf_counter()
                    await cache.lookup(ns, body, pol)
                    out[name].append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                await cache.embedder.embed(para + "  ")  # a text not seen before: no memo
                out["  of which: embedding alone"].append((time.perf_counter() - t0) * 1000)
            return out

        res.update(loop.run(api_level()))
        print(f"\nentries in tenant cache: {loop.run(ctx['cache'].store_.count(ctx['cache'].store_.keys(str(ctx['tenant_id']))))}"
              f"; index: {ctx['cache'].index_kind}; outcomes: {outcomes}\n")
        print("| request | n | p50 ms | p99 ms | mean ms |\n|---|---|---|---|---|")
        for name, xs in res.items():
            print(line(name, xs))
        floor = statistics.median(res["baseline GET /v1/models"])
        ex, se = statistics.median(res["exact hit"]), statistics.median(res["semantic hit"])
        print(f"\nexact hit p50 {ex:.2f} ms (target 3) = {ex / floor:.1f}x the HTTP floor; "
              f"semantic hit p50 {se:.2f} ms (target 15) = {se / floor:.1f}x")
        print("cache stats:", ctx["cache"].stats())
    finally:
        async def stop() -> None:
            ctx["server"].should_exit = True
            await asyncio.wait_for(ctx["task"], 30)
            await ctx["engine"].shutdown()

        loop.run(stop())
        r = redis.Redis.from_url(REDIS_URL)
        for k in r.scan_iter(match=prefix + "*", count=1000):
            r.delete(k)


if __name__ == "__main__":
    main()
