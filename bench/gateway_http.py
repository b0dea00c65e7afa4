"""The whole product over HTTP: latency and server CPU per request of ``python -m gateway.serve``
(uvicorn, the app, its own engine), called by a lean keep-alive client, with 1 and with 50
concurrent clients; optionally against a baseline source tree in the same run.

    python bench/gateway_http.py [--clients 50] [--requests 10] [--single 200] [--rounds 3]
        [--baseline-root DIR | --workers N,M] [--path /v1/chat/completions|/health] [--system-prompt-tokens N]

Each server runs in its own process with the settings ``bench/gateway_overhead.py --http`` uses
(SmolLM2-135M, ``max_tokens=1``, Redis DB 2 under a unique prefix, a SQLite database in a temporary
directory). The client is raw asyncio sockets in this process (one HTTP/1.1 keep-alive connection
per client, ~30 µs of CPU per request) so that it takes little of the CPUs from the server; httpx
costs the 2-core machine enough to spread arrivals and shrink the engine's batches.

Figures per phase: latency p50/p99, requests/s, the server process's CPU per request (from
``/proc``: all threads, and the event-loop thread alone), and requests per engine step.
``--baseline-root DIR`` starts a second server from another checkout (e.g.
``git archive <commit> | tar -x -C DIR``, with ``DIR/data/weights`` linked to this one's) and runs
both, phase by phase and round by round, alternating which goes first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.server_process import GatewayProcess  # noqa: E402

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Say hi."}]
# ``--system-prompt-tokens``: an application's system prompt, the same in every request (~17 tokens a sentence)
SYSTEM_SENTENCE = "You are the support assistant of ACME Corp; answer briefly and cite the manual. "


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def make_tenant(database_url: str) -> str:
    from gateway import tenancy as svc
    from gateway.db.session import Database

    db = Database(database_url)
    await db.upgrade()
    async with db.sessionmaker() as s:
        tenant = await svc.create_tenant(s, name="bench", rpm=1_000_000, tpm=10**9, budget_tokens=10**12)
        _, new = await svc.create_api_key(s, tenant_id=tenant.id)
        await svc.set_price(s, model=MODEL, prompt_usd_per_1m="0.1", completion_usd_per_1m="0.2")
        await s.commit()
    await db.dispose()
    return new.key


class Server(GatewayProcess):
    """``python -m gateway.serve`` from ``root`` in its own process."""

    def __init__(self, name: str, root: Path, tmp: Path, redis_url: str, prefix: str, key_db: str,
                 workers: int | None = None) -> None:
        self.name = name
        env = {**os.environ, "PAGEGATE_DATABASE_URL": key_db, "PAGEGATE_REDIS_URL": redis_url,
               "PAGEGATE_REDIS_PREFIX": prefix, "PAGEGATE_DATA_DIR": str(tmp / name),
               "PAGEGATE_USAGE_SPOOL_DIR": str(tmp / f"{name}-spool"), "PAGEGATE_CACHE_ENABLED": "false",
               "PAGEGATE_IP_RPM": "1000000000", "PAGEGATE_DEFAULT_RPM": "0", "PAGEGATE_DEFAULT_TPM": "0",
               "PAGEGATE_MODEL": MODEL, "PAGEGATE_NUM_BLOCKS": "1024", "PAGEGATE_MAX_MODEL_LEN": "2048",
               "PAGEGATE_MAX_NUM_SEQS": "64", "PAGEGATE_MAX_NUM_BATCHED_TOKENS": "2048",
               "PAGEGATE_LOG_LEVEL": "warning", "PAGEGATE_WEIGHTS_CACHE_DIR": str(ROOT / "data" / "weights"),
               **({"PAGEGATE_WORKERS": str(workers)} if workers else {})}
        super().__init__(free_port(), env, tmp / f"{name}.log", cwd=root, wait=False)

    def steps(self) -> int:
        return int((self.health().get("engine") or {}).get("steps", 0))


class LeanClient:
    """One keep-alive HTTP/1.1 connection, requests written by hand, responses read by length."""

    def __init__(self, port: int, request: bytes) -> None:
        self.port = port
        self.request = request
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def call(self) -> None:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            i = lower.index(b"content-length:")
            await self.reader.readexactly(int(lower[i + 15:lower.index(b"\r\n", i)]))
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {head[:200]!r}")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def build_request(port: int, key: str, path: str, *, system_tokens: int = 0) -> bytes:
    if path == "/health":
        return f"GET /health HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n".encode()
    messages = MESSAGES
    if system_tokens:
        messages = [{"role": "system", "content": SYSTEM_SENTENCE * max(1, system_tokens // 17)}, *MESSAGES]
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0}).encode()
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {key}\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


async def phase(server: Server, request: bytes, n_clients: int, n_requests: int) -> dict:
    clients = [LeanClient(server.port, request) for _ in range(n_clients)]
    lat: list[float] = []

    async def run(c: LeanClient) -> None:
        for _ in range(n_requests):
            t0 = time.perf_counter()
            await c.call()
            lat.append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(c.call() for c in clients))  # connect (not measured)
    await asyncio.sleep(0.3)  # that request's engine step in the figures (a worker's arrive every 0.2 s)
    steps0, (cpu0, loop0) = server.steps(), server.cpu_s()
    t0 = time.perf_counter()
    await asyncio.gather(*(run(c) for c in clients))
    wall = time.perf_counter() - t0
    cpu1, loop1 = server.cpu_s()
    await asyncio.sleep(0.3)  # a worker's engine figures arrive every 0.2 s (engine.ipc.STATS_INTERVAL_S)
    steps = server.steps() - steps0
    for c in clients:
        c.close()
    return {"lat": lat, "wall": wall, "cpu": cpu1 - cpu0, "loop_cpu": loop1 - loop0, "steps": steps}


def merge(into: dict, r: dict) -> None:
    into.setdefault("lat", []).extend(r["lat"])
    for k in ("wall", "cpu", "loop_cpu", "steps"):
        into[k] = into.get(k, 0) + r[k]


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="pagegate-http-bench-"))
    redis_url = os.environ.get("PAGEGATE_REDIS_URL", "redis://127.0.0.1:6379/2")
    from gateway.ids import new_hex_id

    roots = [("this", ROOT, None)] + ([("baseline", Path(args.baseline_root).resolve(), None)]
                                      if args.baseline_root else [])
    if args.workers:  # the same tree with each number of worker processes
        roots = [(f"w{n}", ROOT, n) for n in args.workers]
    servers: list[Server] = []
    keys: dict[str, str] = {}
    prefixes: list[str] = []
    try:
        for name, root, workers in roots:
            db_url = f"sqlite+aiosqlite:///{tmp / (name + '.db')}"
            keys[name] = await make_tenant(db_url)
            prefixes.append(f"pghttp:{new_hex_id()[:8]}:")
            servers.append(Server(name, root, tmp, redis_url, prefixes[-1], db_url, workers))
        for s in servers:  # both load at once; serving starts when both are ready
            s.wait_ready()
        print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.path}; servers: "
              + ", ".join(f"{s.name} ({r})" for s, (_, r, _) in zip(servers, roots, strict=True)), flush=True)
        requests = {s.name: build_request(s.port, keys[s.name], args.path, system_tokens=args.system_prompt_tokens)
                    for s in servers}
        for s in servers:  # warm-up: compiles, connection pools, the key cache, prices
            await phase(s, requests[s.name], args.clients, 2)
            await phase(s, requests[s.name], 1, 20)
        results: dict[tuple[str, str], dict] = {}
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for label, n_clients, n_req in (("1 client", 1, args.single // args.rounds),
                                            (f"{args.clients} clients", args.clients, args.requests)):
                if n_req < 1:
                    continue
                for s in order:
                    merge(results.setdefault((label, s.name), {}),
                          await phase(s, requests[s.name], n_clients, n_req))
        print(f"\n{'phase':<14}{'server':<10}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>8}"
              f"{'CPU ms/req':>11}{'loop thread':>12}{'req/step':>9}")
        for (label, name), r in results.items():
            n = len(r["lat"])
            per_step = f"{n / r['steps']:.1f}" if r["steps"] else "-"
            print(f"{label:<14}{name:<10}{n:>6}{pct(r['lat'], 50):>9.2f}{pct(r['lat'], 99):>9.2f}"
                  f"{n / r['wall']:>8.1f}{r['cpu'] * 1000 / n:>11.3f}{r['loop_cpu'] * 1000 / n:>12.3f}{per_step:>9}")
        if len(servers) == 2:
            first, second = servers[0].name, servers[1].name
            print(f"\n{first} / {second}:")
            for label in dict.fromkeys(k[0] for k in results):
                a, b = results[(label, first)], results[(label, second)]
                na, nb = len(a["lat"]), len(b["lat"])
                print(f"  {label}: p50 {pct(a['lat'], 50) / pct(b['lat'], 50):.2f}x, "
                      f"p99 {pct(a['lat'], 99) / pct(b['lat'], 99):.2f}x, "
                      f"CPU per request {(a['cpu'] / na) / (b['cpu'] / nb):.2f}x "
                      f"(loop thread {(a['loop_cpu'] / na) / max(1e-9, b['loop_cpu'] / nb):.2f}x)")
        for s in servers:  # gateway.loop_lag, from the server's own loop, over the whole run
            loop = (s.metrics().get("event_loop") or {}) if s.proc.poll() is None else {}
            if loop:
                print(f"  {s.name}: the server's event loop lagged at most {loop['lag_ms_worst']:.1f} ms "
                      f"(stalls over {loop['stall_threshold_ms']:g} ms: {loop['stalls_total']})")
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    finally:
        for s in servers:
            s.stop()
        from redis.asyncio import Redis

        r = Redis.from_url(redis_url)
        for prefix in prefixes:
            keys_left = [k async for k in r.scan_iter(match=prefix + "*")]
            if keys_left:
                await r.delete(*keys_left)
        await r.aclose()
    shutil.rmtree(tmp, ignore_errors=True)  # kept, with the servers' logs, when the run failed


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=10, help="requests per client per round (concurrent phase)")
    ap.add_argument("--single", type=int, default=200, help="one-client requests in all (0: skip)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-root", default=None, help="also run a server from this source tree")
    ap.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=None, metavar="N,M",
                    help="compare this tree served with N and with M worker processes (pagegate serve --workers)")
    ap.add_argument("--path", default="/v1/chat/completions", choices=("/v1/chat/completions", "/health"))
    ap.add_argument("--system-prompt-tokens", type=int, default=0, metavar="N",
                    help="put a system prompt of ~N tokens, the same in every request, before the user's message")
    cli = ap.parse_args()
    asyncio.run(main(cli))
