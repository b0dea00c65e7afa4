"""What the gateway adds to a request over calling the engine directly, with 50 concurrent clients.

Modes, run interleaved round by round in one process against one real engine (SmolLM2-135M):

* ``engine``  — ``AsyncEngine.generate`` directly (the baseline);
* ``tenancy`` — the same, wrapped in the gateway's per-request work: per-address limit (slowapi,
  on its threads), authenticate, key/tenant request-rate limit (Redis Lua), quota reserve (Redis Lua), then settle, price lookup and usage record
  (batched writer, SQLite); the time spent in those calls is also measured on its own;
* ``gateway`` — the gateway's per-request work alone (no engine), to show its own cost: latency
  under 50 concurrent clients and process CPU time per request (the figure that does not depend
  on how busy the machine is);
* ``http``    — (``--http``) the real FastAPI app under uvicorn, called with httpx.

Each request asks for ``max_tokens=1`` so the engine part is short. While the engine steps, a
ticker on the gateway's event loop records how late its 1 ms sleeps wake (event-loop stalls).

    python bench/gateway_overhead.py [--clients 50] [--requests 4] [--rounds 2] [--http]

Needs Redis (PAGEGATE_REDIS_URL, default redis://127.0.0.1:6379/2; a unique key prefix is used
and deleted) and writes a SQLite database in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.async_engine import AsyncEngine  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.usage import UsageEvent  # noqa: E402

MESSAGES = [{"role": "user", "content": "Say hi."}]
IP_LIMITER = None  # gateway.ip_limit.ClientIPLimiter: slowapi's per-address check, as the app runs it
CLIENT_REQUEST = None  # a starlette Request from 127.0.0.1 for it


async def ip_check() -> None:
    await IP_LIMITER.check(CLIENT_REQUEST)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


class StallMonitor:
    """Max and p99 lateness of a 1 ms periodic sleep on the loop it runs on."""

    def __init__(self) -> None:
        self.lateness: list[float] = []
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lateness.append((time.perf_counter() - t0 - 0.001) * 1000)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._tick())

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


async def run_engine(engine: AsyncEngine, prompt: list[int]) -> None:
    params = SamplingParams(max_tokens=1, temperature=0.0)
    async for _ in engine.generate(prompt, params, request_id=uuid.uuid4().hex):
        pass


async def direct_request(engine, prompt, _services, _key, lat, _tenancy_ms) -> None:
    t0 = time.perf_counter()
    await run_engine(engine, prompt)
    lat.append((time.perf_counter() - t0) * 1000)


async def tenancy_request(engine, prompt, services, key, lat, tenancy_ms) -> None:
    t0 = time.perf_counter()
    await ip_check()
    principal = await services.auth.authenticate(f"Bearer {key}")
    await services.limiter.check_request(principal)
    res = await services.quota.reserve(principal, model=engine.model_id, prompt_tokens=len(prompt), max_tokens=1)
    t1 = time.perf_counter()
    params = SamplingParams(max_tokens=res.max_tokens, temperature=0.0)
    completion = 0
    request_id = uuid.uuid4().hex
    async for out in engine.generate(prompt, params, request_id=request_id, salt=str(principal.tenant_id)):
        completion += sum(len(d.token_ids) for d in out.deltas)
    t2 = time.perf_counter()
    await services.quota.settle(res, prompt_tokens=len(prompt), completion_tokens=completion)
    cost = await services.prices.cost(engine.model_id, len(prompt), completion)
    services.usage.record(UsageEvent(request_id=request_id, tenant_id=principal.tenant_id,
                                     api_key_id=principal.key_id, model=engine.model_id, status="ok",
                                     prompt_tokens=len(prompt), completion_tokens=completion, cost_usd=cost,
                                     latency_ms=(t2 - t0) * 1000))
    t3 = time.perf_counter()
    lat.append((t3 - t0) * 1000)
    tenancy_ms.append(((t1 - t0) + (t3 - t2)) * 1000)


async def gateway_only_request(engine, prompt, services, key, lat, tenancy_ms) -> None:
    t0 = time.perf_counter()
    await ip_check()
    principal = await services.auth.authenticate(f"Bearer {key}")
    await services.limiter.check_request(principal)
    res = await services.quota.reserve(principal, model=engine.model_id, prompt_tokens=len(prompt), max_tokens=1)
    await services.quota.settle(res, prompt_tokens=len(prompt), completion_tokens=1)
    cost = await services.prices.cost(engine.model_id, len(prompt), 1)
    services.usage.record(UsageEvent(request_id=uuid.uuid4().hex, tenant_id=principal.tenant_id,
                                     api_key_id=principal.key_id, model=engine.model_id, status="ok",
                                     prompt_tokens=len(prompt), completion_tokens=1, cost_usd=cost))
    lat.append((time.perf_counter() - t0) * 1000)
    tenancy_ms.append(lat[-1])


async def clients(fn, n_clients: int, n_requests: int, *args) -> tuple[list[float], list[float], float]:
    lat: list[float] = []
    tenancy_ms: list[float] = []

    async def client() -> None:
        for _ in range(n_requests):
            await fn(*args, lat, tenancy_ms)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(n_clients)))
    return lat, tenancy_ms, time.perf_counter() - t0


class ServerThread:
    """The real app under uvicorn on its own event loop thread (for --http)."""

    def __init__(self, app, port: int) -> None:  # noqa: ANN001
        import uvicorn

        self.loop = asyncio.new_event_loop()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self.server.serve(),), daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def call(self, coro):  # noqa: ANN001, ANN201
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


async def http_request(base_url: str, key: str, model: str, client, lat) -> None:  # noqa: ANN001
    t0 = time.perf_counter()
    r = await client.post(base_url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                          json={"model": model, "messages": MESSAGES, "max_tokens": 1, "temperature": 0})
    r.raise_for_status()
    lat.append((time.perf_counter() - t0) * 1000)


async def http_client_loop(url: str, key: str, model: str, client, lat: list[float], n: int) -> None:  # noqa: ANN001
    for _ in range(n):
        await http_request(url, key, model, client, lat)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=4, help="requests per client per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--http", action="store_true", help="also measure the full HTTP path")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    from gateway import tenancy as svc
    from gateway.tenancy_services import build_tenancy

    tmp = Path(tempfile.mkdtemp(prefix="pagegate-bench-"))
    redis_url = os.environ.get("PAGEGATE_REDIS_URL", "redis://127.0.0.1:6379/2")
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp / 'bench.db'}", redis_url=redis_url,
                        redis_prefix=f"pgbench:{uuid.uuid4().hex[:8]}:", data_dir=str(tmp),
                        usage_spool_dir=str(tmp / "spool"), load_engine=False, cache_enabled=False,
                        default_rpm=0, default_tpm=0, ip_rpm=1_000_000_000)
    config = EngineConfig(model="smollm2-135m-instruct", device=args.device, dtype="auto", num_blocks=1024,
                          max_model_len=2048, max_num_seqs=64, max_num_batched_tokens=2048)
    engine = AsyncEngine(config)
    await engine.start()
    services = await build_tenancy(settings, redis_url=redis_url, upgrade_schema=True)
    async with services.db.sessionmaker() as s:
        tenant = await svc.create_tenant(s, name="bench", rpm=1_000_000, tpm=0, budget_tokens=10**12)
        _, new = await svc.create_api_key(s, tenant_id=tenant.id)
        await svc.set_price(s, model=engine.model_id, prompt_usd_per_1m="0.1", completion_usd_per_1m="0.2")
        await s.commit()
    global IP_LIMITER, CLIENT_REQUEST
    from starlette.requests import Request

    from gateway.ip_limit import ClientIPLimiter

    IP_LIMITER = ClientIPLimiter(redis_url, prefix=settings.redis_prefix, rpm=settings.ip_rpm)
    CLIENT_REQUEST = Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
                              "query_string": b"", "client": ("127.0.0.1", 50000)})
    prompt = engine.encode_chat(MESSAGES)
    print(f"engine: {engine.model_id} on {config.device}; prompt {len(prompt)} tokens; "
          f"{args.clients} clients x {args.requests} requests x {args.rounds} rounds, max_tokens=1")

    server = None
    http_client = None
    if args.http:
        import httpx

        from gateway.app import create_app

        with __import__("socket").socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = ServerThread(create_app(settings, engine=engine), port)
        http_client = httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=args.clients))

    # warm-up (compiles, connection pools, the principal cache)
    await clients(tenancy_request, 4, 2, engine, prompt, services, new.key)
    await clients(direct_request, 4, 2, engine, prompt, services, new.key)

    results: dict[str, dict[str, list[float]]] = {m: {"lat": [], "tenancy": [], "stall": [], "wall": [], "cpu": []}
                                                   for m in ("engine", "tenancy", "gateway", "http")}
    for _ in range(args.rounds):
        for mode, fn in (("engine", direct_request), ("tenancy", tenancy_request), ("gateway", gateway_only_request)):
            n_req = args.requests * (10 if mode == "gateway" else 1)
            mon = StallMonitor()
            mon.start()
            cpu0 = time.process_time()
            lat, ten, wall = await clients(fn, args.clients, n_req, engine, prompt, services, new.key)
            results[mode]["cpu"].append((time.process_time() - cpu0) * 1000 / len(lat))
            await mon.stop()
            r = results[mode]
            r["lat"] += lat
            r["tenancy"] += ten
            r["stall"] += mon.lateness
            r["wall"].append(wall)
        if server is not None:
            mon = StallMonitor()
            server.call(_start(mon))
            lat: list[float] = []
            server_url = f"http://127.0.0.1:{server.server.config.port}"
            t0 = time.perf_counter()
            await asyncio.gather(*(http_client_loop(server_url, new.key, engine.model_id, http_client, lat,
                                                    args.requests) for _ in range(args.clients)))
            results["http"]["wall"].append(time.perf_counter() - t0)
            server.call(mon.stop())
            results["http"]["lat"] += lat
            results["http"]["stall"] += mon.lateness

    base = results["engine"]["lat"]
    print(f"\n{'mode':<10}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'p50 x':>8}{'p99 x':>8}{'req/s':>9}"
          f"{'loop stall max ms':>19}{'p99':>7}")
    for mode, r in results.items():
        if not r["lat"]:
            continue
        lat = r["lat"]
        rps = len(lat) / sum(r["wall"])
        stall = r["stall"] or [0.0]
        print(f"{mode:<10}{len(lat):>6}{pct(lat, 50):>10.2f}{pct(lat, 99):>10.2f}"
              f"{pct(lat, 50) / pct(base, 50):>8.2f}{pct(lat, 99) / pct(base, 99):>8.2f}{rps:>9.1f}"
              f"{max(stall):>19.2f}{pct(stall, 99):>7.2f}")
    g = results["gateway"]
    print(f"\ngateway work alone (IP limit + auth + RPM + quota reserve/settle + price + usage record), {len(g['lat'])} requests "
          f"at {args.clients} concurrent: p50 {pct(g['lat'], 50):.2f} ms, p99 {pct(g['lat'], 99):.2f} ms, "
          f"{statistics.fmean(g['cpu']):.3f} ms process CPU per request "
          f"(engine alone: {statistics.fmean(results['engine']['cpu']):.3f} ms CPU per request)")
    ten = results["tenancy"]["tenancy"]
    print(f"\ngateway work per request while the engine runs, "
          f"{len(ten)} requests at {args.clients} concurrent:")
    print(f"  p50 {pct(ten, 50):.2f} ms   p99 {pct(ten, 99):.2f} ms   mean {statistics.fmean(ten):.2f} ms"
          f"   (targets: p50 <= 2 ms, p99 <= 10 ms)")
    print(f"  latency added over the engine alone: p50 {pct(results['tenancy']['lat'], 50) - pct(base, 50):+.2f} ms, "
          f"p99 {pct(results['tenancy']['lat'], 99) - pct(base, 99):+.2f} ms")
    if results["http"]["lat"]:
        h = results["http"]["lat"]
        print(f"  full HTTP path (uvicorn + FastAPI + JSON + the above): p50 {pct(h, 50) - pct(base, 50):+.2f} ms, "
              f"p99 {pct(h, 99) - pct(base, 99):+.2f} ms over the engine")

    await services.usage.flush()
    if http_client is not None:
        await http_client.aclose()
    if server is not None:
        server.stop()
    keys = [k async for k in services.redis.scan_iter(match=settings.redis_prefix + "*")]
    if keys:
        await services.redis.delete(*keys)
    IP_LIMITER.close()
    await services.close()
    await engine.shutdown()


async def _start(mon: StallMonitor) -> None:
    mon.start()


if __name__ == "__main__":
    asyncio.run(main())
