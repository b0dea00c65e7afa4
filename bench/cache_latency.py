"""Semantic-cache hit latency through HTTP, with 10,000 entries in the tenant's cache.

The gateway runs as its own process, exactly as deployed (``python -m gateway.serve``: uvicorn,
create_app, the SmolLM2 engine, SQLite, Redis DB 4 under a unique prefix); this process is only
the client, so the two never share a GIL or an event loop. Steps:

1. create a tenant and a key in a fresh SQLite database;
2. prefill 10,000 entries for that tenant through the cache's batched ``store_many`` API
   (the server finds them in Redis, as a second gateway process would);
3. start the server; time, interleaved, from one keep-alive ``http.client`` connection:

    baseline      GET /v1/models: the HTTP + auth floor of this server, in the same run
    exact hit     the same request as a cached one             (x-cache: hit)
    semantic hit  a paraphrase ("do" -> "can") of a cached one  (x-cache: semantic-hit)

4. stop the server; time the same lookups straight on the cache API (no HTTP), and the query
   embedding alone: the lean encoder against the HF ``BertModel`` forward, interleaved.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/cache_latency.py [--entries 10000] [--n 300] [--compare-hf]

Targets on the 2-core dev machine: exact hit p50 <= 3 ms, semantic hit p50 <= 15 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import itertools
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.server_process import GatewayProcess  # noqa: E402

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(model: str, text: str) -> dict:
    return {"model": model, "temperature": 0, "max_tokens": 64, "messages": [{"role": "user", "content": text}]}


# ------------------------------------------------------------------------------ setup (this process)


async def make_tenant(db_url: str) -> tuple[str, str]:
    from gateway import tenancy
    from gateway.db.session import Database

    db = Database(db_url)
    try:
        await db.upgrade()
        async with db.sessionmaker() as session:
            tenant = await tenancy.create_tenant(session, name=f"bench-{uuid.uuid4().hex[:6]}")
            _row, key = await tenancy.create_api_key(session, tenant_id=tenant.id)
            await session.commit()
            await session.refresh(tenant)  # (its creation time: part of its cache namespace)
        return tenancy.cache_namespace(tenant), key.key
    finally:
        await db.dispose()


def cache_items(model: str, pairs: list[tuple[str, str]]) -> list[tuple[dict, dict]]:
    from gateway.cache_glue import cache_body
    from gateway.schemas import ChatCompletionRequest

    items = []
    for i, (q, _) in enumerate(pairs):
        body = cache_body(ChatCompletionRequest.model_validate(request(model, q)))
        resp = {"id": f"chatcmpl-prefill-{i}", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"Answer {i}: step one, "
                                                     "open the settings; step two, follow the prompts."},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}}
        items.append((body, resp))
    return items


def build_cache(settings):  # noqa: ANN001, ANN201
    import redis.asyncio as aioredis

    from cache import build_cache as build

    return build(settings, aioredis.Redis.from_url(REDIS_URL))


# -------------------------------------------------------------------------------- the server process


# ``python -m gateway.serve`` with the cache embedder on HF's BertModel forward (--compare-hf)
SERVE_HF = ("import argparse, sys; import cache.embedder as ce; "
            "ce.Embedder.__init__.__kwdefaults__['lean'] = False; from gateway import serve; "
            "p = argparse.ArgumentParser(); serve.register(p.add_subparsers(dest='c', required=True)); "
            "sys.exit(serve.run(p.parse_args(['serve', *sys.argv[1:]])))")


def start_server(env: dict, port: int, log_path: Path, *, hf: bool = False) -> GatewayProcess:
    return GatewayProcess(port, env, log_path, cmd=[sys.executable, "-c", SERVE_HF] if hf else None)


def stop_server(proc: GatewayProcess) -> None:
    proc.stop()


class Client:
    """One keep-alive HTTP/1.1 connection; bodies encoded before the clock starts."""

    def __init__(self, port: int, key: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[float, int, str, bytes]:
        t0 = time.perf_counter()
        self.conn.request(method, path, body=body, headers=self.headers)
        r = self.conn.getresponse()
        data = r.read()
        dt = (time.perf_counter() - t0) * 1000
        return dt, r.status, r.headers.get("x-cache", "-"), data


def time_http(port: int, key: str, model: str, picks: list[tuple[str, str]], warm: int) -> tuple[dict, dict]:
    client = Client(port, key)
    res: dict[str, list[float]] = {"baseline GET /v1/models": [], "exact hit": [], "semantic hit": []}
    outcomes: dict[str, dict[str, int]] = {"exact hit": {}, "semantic hit": {}}
    for i, (q, para) in enumerate(picks):
        for name, text in (("exact hit", q), ("semantic hit", para)):
            dt, status, got, data = client.call("POST", "/v1/chat/completions",
                                                json.dumps(request(model, text)).encode())
            assert status == 200, data[:500]
            if i >= warm:
                res[name].append(dt)
                outcomes[name][got] = outcomes[name].get(got, 0) + 1
        dt, status, _, data = client.call("GET", "/v1/models")
        assert status == 200, data[:500]
        if i >= warm:
            res["baseline GET /v1/models"].append(dt)
    client.conn.close()
    return res, outcomes


# ------------------------------------------------------------------------- the cache API (no HTTP)


async def time_api(cache, hf_embedder, namespace: str, model: str, picks, settings) -> dict:  # noqa: ANN001
    from cache import default_policy
    from gateway.cache_glue import cache_body
    from gateway.schemas import ChatCompletionRequest

    pol = default_policy(settings)
    out: dict[str, list[float]] = {"cache API exact": [], "cache API semantic": [],
                                   "  query embedding, lean encoder": [], "  query embedding, HF BertModel": []}
    await hf_embedder.ready()
    await hf_embedder.warmup()
    for i, (q, para) in enumerate(picks):
        for name, text in (("cache API exact", q), ("cache API semantic", para + " ")):
            body = cache_body(ChatCompletionRequest.model_validate(request(model, text)))
            t0 = time.perf_counter()
            got = await cache.lookup(namespace, body, pol)
            out[name].append((time.perf_counter() - t0) * 1000)
            assert got.outcome in ("hit", "semantic-hit"), (text, got)
        for name, emb in (("  query embedding, lean encoder", cache.embedder),
                          ("  query embedding, HF BertModel", hf_embedder)):
            t0 = time.perf_counter()
            await emb.embed(f"{para} ({i})")  # a text not seen before: no memo
            out[name].append((time.perf_counter() - t0) * 1000)
    return out


# ------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--warm", type=int, default=20, help="warm-up requests of each kind, not timed")
    ap.add_argument("--compare-hf", action="store_true",
                    help="then time a second server whose cache embedder runs HF's BertModel forward")
    args = ap.parse_args()
    import redis

    from cache import default_policy
    from cache.embedder import Embedder
    from gateway.serve import served_model_id
    from gateway.settings import Settings

    prefix = f"benchlat-{uuid.uuid4().hex[:8]}:"
    tmp = Path(tempfile.mkdtemp(prefix="pagegate-bench-"))
    db_url = f"sqlite+aiosqlite:///{tmp}/bench.db"
    env_settings = {"DATABASE_URL": db_url, "REDIS_URL": REDIS_URL, "REDIS_PREFIX": prefix,
                    "DATA_DIR": str(tmp), "USAGE_SPOOL_DIR": str(tmp / "spool"),
                    "WEIGHTS_CACHE_DIR": str(ROOT / "data" / "weights"), "KV_CACHE_MEMORY_GB": "0.25",
                    "DEFAULT_RPM": str(10**7), "DEFAULT_TPM": str(10**9), "IP_RPM": "0",
                    "CACHE_ENABLED": "true", "CACHE_MAX_ENTRIES": str(args.entries), "LOG_LEVEL": "warning"}
    settings = Settings(**{k.lower(): v for k, v in env_settings.items()})
    model = served_model_id(settings)
    namespace, key = asyncio.run(make_tenant(db_url))
    pairs = questions(args.entries)
    step = max(1, len(pairs) // (args.n + args.warm))
    picks = pairs[::step][: args.n + args.warm]
    proc = None
    try:
        async def prefill() -> tuple[float, object]:
            cache = build_cache(settings)
            t0 = time.perf_counter()
            await cache.store_many(namespace, cache_items(model, pairs), default_policy(settings))
            took = time.perf_counter() - t0
            count = await cache.store_.count(cache.store_.keys(namespace))
            await cache.close()
            return took, count

        took, count = asyncio.run(prefill())
        print(f"prefilled {count} entries in {took:.1f} s (embedding included)", flush=True)

        env = dict(os.environ, **{"PAGEGATE_" + k: v for k, v in env_settings.items()})
        port = free_port()
        t0 = time.perf_counter()
        proc = start_server(env, port, tmp / "server.log")
        print(f"server pid {proc.proc.pid} up in {time.perf_counter() - t0:.1f} s "
              f"(OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')})", flush=True)
        res, outcomes = time_http(port, key, model, picks, args.warm)
        stop_server(proc)
        if args.compare_hf:
            proc = start_server(env, port, tmp / "server-hf.log", hf=True)
            hf_res, hf_outcomes = time_http(port, key, model, picks, args.warm)
            stop_server(proc)
            outcomes["HF server"] = hf_outcomes
            res.update({f"HF-embedder server: {k}": v for k, v in hf_res.items()})

        async def api_level() -> dict:
            cache = build_cache(settings)
            hf = Embedder(settings.embedding_model, lean=False)
            try:
                await time_api(cache, hf, namespace, model, picks[: args.warm], settings)  # warm-up
                return await time_api(cache, hf, namespace, model, picks[args.warm:], settings)
            finally:
                hf.close()
                await cache.close()

        res.update(asyncio.run(api_level()))
        print(f"\nentries in tenant cache: {count}; HTTP outcomes: {outcomes}\n")
        print("| request | n | p50 ms | p99 ms | mean ms |\n|---|---|---|---|---|")
        for name, xs in res.items():
            print(line(name, xs))
        floor = statistics.median(res["baseline GET /v1/models"])
        ex, se = statistics.median(res["exact hit"]), statistics.median(res["semantic hit"])
        lean = statistics.median(res["  query embedding, lean encoder"])
        hf_ms = statistics.median(res["  query embedding, HF BertModel"])
        print(f"\nexact hit p50 {ex:.2f} ms (target 3) = floor + {ex - floor:.2f} ms; "
              f"semantic hit p50 {se:.2f} ms (target 15) = floor + {se - floor:.2f} ms")
        print(f"query embedding p50: lean {lean:.2f} ms vs HF {hf_ms:.2f} ms, ratio {lean / hf_ms:.2f}")
        if args.compare_hf:
            hse = statistics.median(res["HF-embedder server: semantic hit"])
            print(f"semantic hit through HTTP p50: lean {se:.2f} ms vs HF-embedder server {hse:.2f} ms, "
                  f"ratio {se / hse:.2f}")
        shutil.rmtree(tmp, ignore_errors=True)  # kept, with the server logs, when a step failed
    finally:
        if proc is not None:
            stop_server(proc)
        r = redis.Redis.from_url(REDIS_URL)
        for k in r.scan_iter(match=prefix + "*", count=1000):
            r.delete(k)


if __name__ == "__main__":
    main()
