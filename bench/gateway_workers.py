"""What the gateway adds with its work spread over several front processes (``pagegate serve
--workers N``: the engine in a process of its own), against the engine called directly, with 50
concurrent clients arriving in waves (``max_tokens=1``).

This process runs the engine (``AsyncEngine``, SmolLM2-135M, the settings of
``bench/gateway_overhead.py``) behind ``engine.ipc.EngineServer`` and times its steps
(``StepClock``). ``--workers N`` front processes (this script with ``--front``) each run
``clients / N`` clients, as a worker holds its share of the connections. Phases, interleaved
round by round:

* ``engine in-process``  the 50 clients in this process call ``AsyncEngine.generate``: the
  single-process baseline (``gateway_overhead.py``'s ``engine`` phase);
* ``engine via N fronts`` the fronts' clients call ``RemoteEngine.generate`` directly: the
  engine as the fronts reach it (the socket hop, no gateway work);
* ``gateway, N fronts``  the same, each request wrapped in the gateway's per-request work
  (``gateway_overhead.Bench.wrapped``: per-address limit, key, RPM, quota reservation, the
  engine's notice, settlement, usage row), on each front's own event loop.

Printed per phase: latency p50/p99, requests per engine step, and on the engine's clock the wait
for work before each step (medians over the steps, then over the rounds). In waves the change of
that wait is what the gateway's work puts on the critical path; it is printed against both
baselines.

    python bench/gateway_workers.py [--workers 2] [--clients 50] [--requests 8] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_http import make_tenant  # noqa: E402
from bench.gateway_overhead import MESSAGES, Bench, StepClock, clients, pct  # noqa: E402
from gateway.ids import new_hex_id  # noqa: E402
from gateway.settings import Settings  # noqa: E402

ENGINE = dict(model="smollm2-135m-instruct", dtype="auto", num_blocks=1024, max_model_len=2048, max_num_seqs=64,
              max_num_batched_tokens=2048)


def bench_settings(tmp: Path, redis_url: str, prefix: str) -> Settings:
    return Settings(database_url=f"sqlite+aiosqlite:///{tmp / 'bench.db'}", redis_url=redis_url, redis_prefix=prefix,
                    data_dir=str(tmp), usage_spool_dir=str(tmp / f"spool-{os.getpid()}"), load_engine=False,
                    cache_enabled=False, default_rpm=0, default_tpm=0, ip_rpm=1_000_000_000)


async def make_bench(settings: Settings, engine, key: str):  # noqa: ANN001, ANN201
    """``gateway_overhead.Bench`` on ``engine`` with this process's own tenancy services."""
    from starlette.requests import Request

    from gateway.heap import tune_gc
    from gateway.ip_limit import ClientIPLimiter
    from gateway.tenancy_services import build_tenancy

    services = await build_tenancy(settings, redis_url=settings.redis_url)
    ip_limiter = ClientIPLimiter(settings.redis_url, prefix=settings.redis_prefix, rpm=settings.ip_rpm,
                                 redis=services.redis)
    client_request = Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
                              "query_string": b"", "client": ("127.0.0.1", 50000)})
    bench = Bench(engine, services, ip_limiter, client_request, key, engine.encode_chat(MESSAGES))
    tune_gc(settings)
    return bench, services, ip_limiter


# ---- a front process -------------------------------------------------------------------------

async def front(args: argparse.Namespace) -> None:
    """Reads ``<mode> <clients> <requests>`` lines, runs them, answers a JSON line of latencies."""
    from engine.remote_engine import RemoteEngine

    settings = bench_settings(Path(args.tmp), args.redis_url, args.prefix)
    engine = RemoteEngine(args.socket)
    await engine.start()
    bench, services, ip_limiter = await make_bench(settings, engine, args.key)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := (await reader.readline()).decode().split():
        mode, n_clients, n_req = line[0], int(line[1]), int(line[2])
        fn = bench.wrapped if mode == "wrapped" else bench.direct
        lat, _, _ = await clients(fn, n_clients, n_req)
        await services.aftercare.drain()
        await services.usage.flush()
        print(json.dumps({"lat": lat}), flush=True)
    await ip_limiter.aclose()
    await services.close()
    await engine.shutdown()


# ---- the engine's process --------------------------------------------------------------------

class Front:
    def __init__(self, args: argparse.Namespace, tmp: Path, socket_path: str, key: str, prefix: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--front", "--socket", socket_path, "--key", key, "--tmp", str(tmp),
             "--prefix", prefix, "--redis-url", args.redis_url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    async def read(self) -> dict:
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if not line:
            raise RuntimeError(f"a front process exited ({self.proc.wait()})")
        return json.loads(line)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def main(args: argparse.Namespace) -> None:
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.ipc import EngineServer
    from gateway.app import apply_gil_switch_interval

    tmp = Path(tempfile.mkdtemp(prefix="pagegate-workers-bench-"))
    prefix = f"pgwbench:{new_hex_id()[:8]}:"
    settings = bench_settings(tmp, args.redis_url, prefix)
    apply_gil_switch_interval(settings)
    engine = AsyncEngine(EngineConfig(device=args.device, **ENGINE))
    await engine.start()
    clock = StepClock(engine)
    key = await make_tenant(settings.database_url)  # the tenant and prices of the HTTP bench
    server = EngineServer(engine, tmp / "engine.sock")
    await server.start()
    local, local_services, local_ip = await make_bench(settings, engine, key)
    fronts = [Front(args, tmp, server.path, key, prefix) for _ in range(args.workers)]
    try:
        for f in fronts:
            assert (await f.read())["ready"]
        share = [args.clients // args.workers + (i < args.clients % args.workers) for i in range(args.workers)]

        async def on_fronts(mode: str, n_req: int) -> list[float]:
            for f, n in zip(fronts, share, strict=True):
                f.send(f"{mode} {n} {n_req}")
            replies = await asyncio.gather(*(f.read() for f in fronts))
            return [x for r in replies for x in r["lat"]]

        async def in_process(n_req: int) -> list[float]:
            lat, _, _ = await clients(local.direct, args.clients, n_req)
            return lat

        # warm-up: connections, compiles, the key caches, prices
        await on_fronts("wrapped", 2)
        await on_fronts("direct", 2)
        await in_process(2)
        phases = {"engine in-process": lambda: in_process(args.requests),
                  f"engine via {args.workers} fronts": lambda: on_fronts("direct", args.requests),
                  f"gateway, {args.workers} fronts": lambda: on_fronts("wrapped", args.requests)}
        results = {name: {"lat": [], "idle": [], "step": [], "steps": 0} for name in phases}
        print(f"engine: {engine.model_id}; {args.clients} clients over {args.workers} front processes "
              f"({'/'.join(map(str, share))}), {args.requests} requests each x {args.rounds} rounds, max_tokens 1; "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
        for rnd in range(args.rounds):
            names = list(phases) if rnd % 2 == 0 else list(phases)[::-1]
            for name in names:
                t0 = time.perf_counter()
                lat = await phases[name]()
                spans = clock.since(t0)
                r = results[name]
                r["lat"] += lat
                r["steps"] += len(spans)
                r["idle"].append(statistics.median((b[0] - a[1]) * 1000
                                                   for a, b in zip(spans, spans[1:], strict=False)))
                r["step"].append(statistics.median((e - b) * 1000 for b, e in spans))
        print(f"\n{'phase':<26}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'req/step':>9}{'step ms':>9}"
              f"{'wait before a step, ms':>24}")
        for name, r in results.items():
            idle = r["idle"]
            print(f"{name:<26}{len(r['lat']):>6}{pct(r['lat'], 50):>9.2f}{pct(r['lat'], 99):>9.2f}"
                  f"{len(r['lat']) / max(1, r['steps']):>9.1f}{statistics.median(r['step']):>9.1f}"
                  f"{statistics.median(idle):>10.2f} "
                  f"(rounds {min(idle):.2f}..{max(idle):.2f})")
        names = list(results)
        gw = results[names[2]]["idle"]
        for base in names[:2]:
            d = [g - b for g, b in zip(gw, results[base]["idle"], strict=True)]
            print(f"  the gateway's added wait per step against {base}: median {statistics.median(d):+.2f} ms "
                  f"(rounds {min(d):+.2f} .. {max(d):+.2f}); p50 latency "
                  f"{pct(results[names[2]]['lat'], 50) - pct(results[base]['lat'], 50):+.2f} ms")
    finally:
        for f in fronts:
            f.stop()
        await local_ip.aclose()
        await local_services.close()
        await server.close()
        await engine.shutdown()
        from redis.asyncio import Redis

        r = Redis.from_url(args.redis_url)
        keys = [k async for k in r.scan_iter(match=prefix + "*")]
        if keys:
            await r.delete(*keys)
        await r.aclose()
    shutil.rmtree(tmp, ignore_errors=True)  # kept when the run failed


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="front processes")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=8, help="requests per client per phase")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--redis-url", default=os.environ.get("PAGEGATE_REDIS_URL", "redis://127.0.0.1:6379/2"))
    ap.add_argument("--front", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--key", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", help=argparse.SUPPRESS)
    cli = ap.parse_args()
    import uvloop

    uvloop.run(front(cli) if cli.front else main(cli))
