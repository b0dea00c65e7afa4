"""What the gateway adds to a request over calling the engine directly, with 50 concurrent clients.

Phases, run interleaved round by round in one process against one real engine (SmolLM2-135M), on
uvloop as ``pagegate serve`` (uvicorn) runs, with the GIL switch interval the app sets
(``PAGEGATE_GIL_SWITCH_INTERVAL_MS``):

* ``engine``          ``AsyncEngine.generate`` called directly: the baseline;
* ``engine+gateway``  the same request wrapped in the gateway's per-request work, as the app does
  it: per-address limit (slowapi's declared limit, ``limits``' script), authenticate (cached),
  key/tenant request-rate limit (one Lua script), quota + TPM reservation (one Lua script), then
  settle (one Lua script), price and usage row (journal write); the four scripts on the gateway's
  pipelined connection. The issue's figure is the latency this adds over ``engine``; the time
  each request spends inside the gateway's calls, and the engine steps per request, are shown;
* ``gateway alone``   the same work without the engine: its process CPU per request (the figure
  that does not depend on how busy the machine is) and its throughput on one event loop;
* ``http``            (``--http``) the whole product: ``python -m gateway.serve`` (uvicorn, the app,
  its own engine with the same settings) in its own process, called over HTTP from this process by
  ``bench/gateway_http.py``'s lean keep-alive client (raw sockets, ~30 µs a request): its latency
  includes HTTP, FastAPI and JSON; the server process's CPU per request is measured from ``/proc``.

Each request asks for ``max_tokens=1`` by default, so the engine part is short and every client's
requests arrive together, in waves of 50 (the gateway's worst case: 50 admissions at once).
``--max-tokens 1:32`` draws each request's length from that range instead (the same seeded
sequence in every phase; EOS ignored so each request makes exactly that many tokens), so clients
finish on different engine steps and their next requests arrive staggered, as 50 independent
clients' do. The added latency is printed pooled (difference of the phases' medians) and round by
round (each engine+gateway phase against the engine-alone phase just before it, with how much the
engine alone moves between its own rounds: the noise floor), and counted in engine steps (the steps
each request waited beyond its own tokens, with and without the gateway: a step missed while the
gateway admitted a request shows there whatever the engine's speed). A ticker on the event loop
records how late its 1 ms sleeps wake (event-loop stalls); ``--stall-trace`` also samples, from a
watchdog thread, where the loop thread and the engine thread are while the loop is late.

    python bench/gateway_overhead.py [--clients 50] [--requests 4] [--rounds 8] [--http] [--stall-trace]
        [--compare-switch-intervals 5,1] [--engine-threads N] [--loop uvloop|asyncio]
        [--timeline] [--leave-out ip,rpm,reserve,usage]

Needs Redis (PAGEGATE_REDIS_URL, default redis://127.0.0.1:6379/2; a unique key prefix is used
and deleted) and writes a SQLite database in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.server_process import GatewayProcess  # noqa: E402
from bench.wave_timeline import WaveTimeline  # noqa: E402
from engine.async_engine import AsyncEngine  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from gateway.ids import new_hex_id  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.usage import UsageEvent  # noqa: E402

MESSAGES = [{"role": "user", "content": "Say hi."}]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else float("nan")


class StallMonitor:
    """Lateness of a 1 ms periodic sleep on the loop it runs on."""

    def __init__(self) -> None:
        self.lateness: list[float] = []
        self.heartbeat = time.perf_counter()
        self._task: asyncio.Task | None = None

    async def _tick(self) -> None:
        while True:
            t0 = time.perf_counter()
            self.heartbeat = t0
            await asyncio.sleep(0.001)
            self.lateness.append((time.perf_counter() - t0 - 0.001) * 1000)

    def start(self) -> None:
        self.heartbeat = time.perf_counter()
        self._task = asyncio.ensure_future(self._tick())

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


class StallTracer:
    """A watchdog thread: when the loop's ticker is more than ``late_ms`` late, sample where the
    loop thread and the engine thread are (their innermost frames in our code or a library)."""

    def __init__(self, monitor_getter, loop_thread: int, late_ms: float = 5.0) -> None:  # noqa: ANN001
        self.monitor_getter = monitor_getter
        self.loop_thread = loop_thread
        self.late_s = late_ms / 1000
        self.loop_sites: collections.Counter[str] = collections.Counter()
        self.engine_sites: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-tracer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    @staticmethod
    def _site(frame) -> str:  # noqa: ANN001
        parts = []
        while frame is not None and len(parts) < 3:
            code = frame.f_code
            parts.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
            frame = frame.f_back
        return " < ".join(parts)

    def _run(self) -> None:
        engine_thread = None
        while not self._stop.wait(0.002):
            mon = self.monitor_getter()
            if mon is None or time.perf_counter() - mon.heartbeat < self.late_s:
                continue
            frames = sys._current_frames()
            if engine_thread is None:
                engine_thread = next((t.ident for t in threading.enumerate() if t.name == "pagegate-engine"), None)
            self.samples += 1
            if self.loop_thread in frames:
                self.loop_sites[self._site(frames[self.loop_thread])] += 1
            if engine_thread in frames:
                self.engine_sites[self._site(frames[engine_thread])] += 1


class StepClock:
    """When each engine step started and ended (``perf_counter``), recorded on the engine's thread
    by wrapping ``LLMEngine.step``: the time between one step's end and the next one's start is
    the engine waiting for work, which in waves is the clients' and the gateway's work between
    steps, free of the step time's own noise."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.spans: list[tuple[float, float]] = []
        step = engine.engine.step

        def timed_step():  # noqa: ANN202
            t0 = time.perf_counter()
            outs = step()
            if outs:  # a step that ran the model (an empty schedule returns nothing)
                self.spans.append((t0, time.perf_counter()))
            return outs

        engine.engine.step = timed_step

    def since(self, t0: float) -> list[tuple[float, float]]:
        return [s for s in self.spans if s[0] >= t0]


async def run_engine(engine: AsyncEngine, prompt: list[int], max_tokens: int = 1, salt: str | None = None,
                     notice=None) -> int:  # noqa: ANN001
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    completion = 0
    async for out in engine.generate(prompt, params, request_id=new_hex_id(), salt=salt, notice=notice):
        completion += sum(len(d.token_ids) for d in out.deltas)
    return completion


LEAVE_OUT = ("ip", "rpm", "reserve", "usage", "notice")  # ``--leave-out``: parts of the gateway's work to skip


class _Unreserved:
    """``--leave-out reserve``: the request goes to the engine with the tokens it asked for."""

    __slots__ = ("max_tokens",)

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens


class Bench:
    def __init__(self, engine, services, ip_limiter, client_request, key: str, prompt: list[int],  # noqa: ANN001
                 lengths: tuple[int, int] = (1, 1), *, timeline: WaveTimeline | None = None,
                 leave_out: frozenset[str] = frozenset()) -> None:
        self.timeline = timeline
        self.leave_out = leave_out
        self.lengths = lengths
        self.rng = random.Random(0)
        self.engine = engine
        self.services = services
        self.ip_limiter = ip_limiter
        self.client_request = client_request
        self.key = key
        self.prompt = prompt
        self.waited: list[int] = []  # per request: engine steps finished while it ran, beyond its own tokens
        self.after: list[float] = []  # per wrapped request: ms inside the gateway's calls after the engine

    def restart(self) -> None:
        """Each phase draws the same sequence of request lengths."""
        self.rng = random.Random(0)

    def length(self) -> int:
        return self.rng.randint(*self.lengths)

    async def admit(self, max_tokens: int = 1, announce: bool = False):  # noqa: ANN201
        """The gateway's work before the engine: per-address limit, auth, RPM, quota reservation.
        With ``announce``, the engine's notice is taken where the app takes it (``gateway.deps``:
        once the key is known, before the RPM check) and closed if the request is refused;
        returns (principal, reservation, notice)."""
        s, skip = self.services, self.leave_out
        notice = None
        try:
            if "ip" not in skip:
                await self.ip_limiter.check(self.client_request)
            principal = await s.auth.authenticate(f"Bearer {self.key}")
            if announce:
                notice = self.engine.announce()
            if "rpm" not in skip:
                await s.limiter.check_request(principal)
            if "reserve" in skip:
                return principal, _Unreserved(max_tokens), notice
            res = await s.quota.reserve(principal, model=self.engine.model_id, prompt_tokens=len(self.prompt),
                                        max_tokens=max_tokens)
            return principal, res, notice
        except BaseException:
            if notice is not None:
                notice.close()
            raise

    async def finish(self, principal, res, completion: int, started: float) -> None:  # noqa: ANN001
        """The gateway's work after the engine: price, usage row, settle; like the app
        (``RequestAccount.close``) the settlement is handed to ``services.aftercare`` (run
        ``settle_delay_ms`` later, in batches) unless that delay is 0."""
        s = self.services
        model = self.engine.model_id
        care = s.aftercare
        if isinstance(res, _Unreserved):  # --leave-out reserve: nothing to settle
            pass
        elif care.inline:
            await self._settle(res, completion)
        else:
            quota = s.quota  # as ``RequestAccount._finish``: submitted when the batch runs, no task per request
            care.submit(lambda: quota.settle_soon(res, prompt_tokens=len(self.prompt), completion_tokens=completion),
                        f"(quota settlement of {res.id})")
        if "usage" in self.leave_out:
            return
        prices = s.prices  # as ``RequestAccount.close_now``: the loaded prices, nothing awaited
        cost = (prices.cost_now(model, len(self.prompt), completion) if prices.loaded
                else await prices.cost(model, len(self.prompt), completion))
        if s.metrics is not None:  # as ``RequestAccount._record``: the request counters for /metrics
            s.metrics.observe(endpoint="chat.completions", model=model, tenant=principal.tenant_id, status="ok",
                              cache=None, prompt_tokens=len(self.prompt), cached_prompt_tokens=0,
                              completion_tokens=completion, cost_usd=float(cost), saved_usd=0.0,
                              latency_s=time.perf_counter() - started, ttft_s=None)
        s.usage.record(UsageEvent(request_id=new_hex_id(), tenant_id=principal.tenant_id,
                                  api_key_id=principal.key_id, model=model, status="ok",
                                  prompt_tokens=len(self.prompt), completion_tokens=completion, cost_usd=cost,
                                  latency_ms=(time.perf_counter() - started) * 1000))

    async def _settle(self, res, completion: int) -> None:  # noqa: ANN001
        await self.services.quota.settle(res, prompt_tokens=len(self.prompt), completion_tokens=completion)

    def steps(self) -> int:
        return self.engine.stats().steps  # steps finished so far (the last step's snapshot)

    async def direct(self, lat: list[float], _part: list[float]) -> None:
        n = self.length()
        t0, s0 = time.perf_counter(), self.steps()
        if self.timeline is not None:
            self.timeline.mark("start")
            self.timeline.mark("admitted")
        completion = await run_engine(self.engine, self.prompt, n)
        if self.timeline is not None:
            self.timeline.mark("out")
        lat.append((time.perf_counter() - t0) * 1000)
        self.waited.append(self.steps() - s0 - completion)

    async def wrapped(self, lat: list[float], part: list[float]) -> None:
        n = self.length()
        t0, s0 = time.perf_counter(), self.steps()
        timeline = self.timeline
        if timeline is not None:
            timeline.mark("start")
        principal, res, notice = await self.admit(n, announce="notice" not in self.leave_out)
        t1 = time.perf_counter()
        if timeline is not None:
            timeline.mark("admitted")
        completion = await run_engine(self.engine, self.prompt, res.max_tokens, str(principal.tenant_id), notice)
        t2 = time.perf_counter()
        if timeline is not None:
            timeline.mark("out")
        self.waited.append(self.steps() - s0 - completion)
        await self.finish(principal, res, completion, t0)
        t3 = time.perf_counter()
        lat.append((t3 - t0) * 1000)
        part.append(((t1 - t0) + (t3 - t2)) * 1000)
        self.after.append((t3 - t2) * 1000)

    async def alone(self, lat: list[float], part: list[float]) -> None:
        t0 = time.perf_counter()
        principal, res, _ = await self.admit()
        await self.finish(principal, res, 1, t0)
        lat.append((time.perf_counter() - t0) * 1000)
        part.append(lat[-1])


async def clients(fn, n_clients: int, n_requests: int) -> tuple[list[float], list[float], float]:  # noqa: ANN001
    lat: list[float] = []
    part: list[float] = []

    async def client() -> None:
        for _ in range(n_requests):
            await fn(lat, part)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(n_clients)))
    return lat, part, time.perf_counter() - t0


async def http_client_loop(client, lat: list[float], n: int) -> None:  # noqa: ANN001 - gateway_http.LeanClient
    for _ in range(n):
        t0 = time.perf_counter()
        await client.call()
        lat.append((time.perf_counter() - t0) * 1000)


async def main(args: argparse.Namespace) -> None:
    from gateway import tenancy as svc
    from gateway.app import apply_gil_switch_interval
    from gateway.heap import tune_gc
    from gateway.tenancy_services import build_tenancy

    tmp = Path(tempfile.mkdtemp(prefix="pagegate-bench-"))
    redis_url = os.environ.get("PAGEGATE_REDIS_URL", "redis://127.0.0.1:6379/2")
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp / 'bench.db'}", redis_url=redis_url,
                        redis_prefix=f"pgbench:{new_hex_id()[:8]}:", data_dir=str(tmp),
                        usage_spool_dir=str(tmp / "spool"), load_engine=False, cache_enabled=False,
                        default_rpm=0, default_tpm=0, ip_rpm=1_000_000_000,
                        **({} if args.settle_delay_ms is None else {"settle_delay_ms": args.settle_delay_ms}),
                        **({} if args.switch_interval_ms is None else {"gil_switch_interval_ms": args.switch_interval_ms}))
    apply_gil_switch_interval(settings)  # what create_app's lifespan does
    config = EngineConfig(model="smollm2-135m-instruct", device=args.device, dtype="auto", num_blocks=1024,
                          max_model_len=2048, max_num_seqs=64, max_num_batched_tokens=2048,
                          num_threads=args.engine_threads,
                          **({} if args.admission_gap_ms is None else {"admission_gap_ms": args.admission_gap_ms}),
                          **({} if args.admission_notice_gap_ms is None
                             else {"admission_notice_gap_ms": args.admission_notice_gap_ms}))
    engine = AsyncEngine(config)
    await engine.start()
    services = await build_tenancy(settings, redis_url=redis_url, upgrade_schema=True)
    async with services.db.sessionmaker() as s:
        tenant = await svc.create_tenant(s, name="bench", rpm=1_000_000, tpm=10**9, budget_tokens=10**12)
        _, new = await svc.create_api_key(s, tenant_id=tenant.id)
        await svc.set_price(s, model=engine.model_id, prompt_usd_per_1m="0.1", completion_usd_per_1m="0.2")
        await s.commit()
    from starlette.requests import Request

    from gateway.ip_limit import ClientIPLimiter

    ip_limiter = ClientIPLimiter(redis_url, prefix=settings.redis_prefix, rpm=settings.ip_rpm, redis=services.redis)
    client_request = Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
                              "query_string": b"", "client": ("127.0.0.1", 50000)})
    prompt = engine.encode_chat(MESSAGES)
    clock = StepClock(engine)
    undo_gc = tune_gc(settings)  # what create_app's lifespan does once started: freeze the start-up heap
    leave_out = frozenset(args.leave_out)
    timeline = None
    if args.timeline:
        timeline = WaveTimeline()
        for coalescer, name in ((ip_limiter._batches, "per-address"), (services.limiter._batches, "key/tenant RPM"),
                                (services.quota._batches, "reservation")):
            timeline.watch(coalescer, name)
        timeline.watch_engine(engine)
    bench = Bench(engine, services, ip_limiter, client_request, new.key, prompt, args.max_tokens,
                  timeline=timeline, leave_out=leave_out)
    if leave_out:
        print(f"ABLATION: the gateway's work without {', '.join(sorted(leave_out))} (--leave-out): these figures "
              f"are not the gateway's; they say what the parts left out cost")
    loop_name = type(asyncio.get_running_loop()).__module__.split(".")[0]
    print(f"engine: {engine.model_id} on {config.device}; prompt {len(prompt)} tokens; {args.clients} clients x "
          f"{args.requests} requests x {args.rounds} rounds, max_tokens {_describe(args.max_tokens)}; event loop: {loop_name}; "
          f"GIL switch interval {sys.getswitchinterval() * 1000:g} ms; settlement {settings.settle_delay_ms:g} ms "
          f"after the response; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")

    server = None
    http_clients: list = []
    if args.http:
        from bench.gateway_http import LeanClient, build_request

        with __import__("socket").socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server_db = f"sqlite+aiosqlite:///{tmp / 'server.db'}"
        from gateway.db.session import Database

        db = Database(server_db)
        await db.upgrade()
        async with db.sessionmaker() as s:
            t = await svc.create_tenant(s, name="bench", rpm=1_000_000, tpm=10**9, budget_tokens=10**12)
            _, server_key = await svc.create_api_key(s, tenant_id=t.id)
            await svc.set_price(s, model=engine.model_id, prompt_usd_per_1m="0.1", completion_usd_per_1m="0.2")
            await s.commit()
        await db.dispose()
        env = {**os.environ, "PAGEGATE_DATABASE_URL": server_db, "PAGEGATE_REDIS_URL": redis_url,
               "PAGEGATE_REDIS_PREFIX": settings.redis_prefix, "PAGEGATE_DATA_DIR": str(tmp / "server"),
               "PAGEGATE_USAGE_SPOOL_DIR": str(tmp / "server-spool"), "PAGEGATE_CACHE_ENABLED": "false",
               "PAGEGATE_IP_RPM": str(settings.ip_rpm), "PAGEGATE_DEFAULT_RPM": "0", "PAGEGATE_DEFAULT_TPM": "0",
               "PAGEGATE_GIL_SWITCH_INTERVAL_MS": str(settings.gil_switch_interval_ms),
               "PAGEGATE_MODEL": config.model, "PAGEGATE_DEVICE": config.device, "PAGEGATE_NUM_BLOCKS": "1024",
               "PAGEGATE_MAX_MODEL_LEN": "2048", "PAGEGATE_MAX_NUM_SEQS": "64",
               "PAGEGATE_MAX_NUM_BATCHED_TOKENS": "2048", "PAGEGATE_LOG_LEVEL": "warning",
               **({"PAGEGATE_NUM_THREADS": str(args.engine_threads)} if args.engine_threads else {})}
        server = GatewayProcess(port, env, tmp / "server.log")
        request = build_request(port, server_key.key, "/v1/chat/completions")
        http_clients = [LeanClient(port, request) for _ in range(args.clients)]
        lat_warm: list[float] = []
        await asyncio.gather(*(http_client_loop(c, lat_warm, 2) for c in http_clients))

    current: list[StallMonitor | None] = [None]
    tracer = None
    if args.stall_trace:
        tracer = StallTracer(lambda: current[0], threading.get_ident())
        tracer.start()

    # warm-up (compiles, connection pools, the principal cache, prices)
    await clients(bench.wrapped, args.clients, 2)  # as many Redis connections as clients
    await clients(bench.direct, 4, 2)
    if timeline is not None:
        timeline.events.clear()  # the warm-up's waves are no phase's

    modes = ("engine", "engine+gateway", "gateway alone", "http")
    def empty(names=modes) -> dict:  # noqa: ANN001
        return {m: {"lat": [], "part": [], "stall": [], "wall": [], "cpu": [], "loop_cpu": [], "steps": 0,
                    "rounds": [], "waited": [], "after": [], "idle": [], "step_ms": []} for m in names}

    results = empty()

    async def phase(mode: str, fn, n_clients: int, n_req: int, into: dict) -> None:  # noqa: ANN001
        bench.restart()
        mon = StallMonitor()
        current[0] = mon
        mon.start()
        cpu0, tcpu0, steps0 = time.process_time(), time.thread_time(), engine.stats().steps
        phase_t0 = time.perf_counter()
        bench.waited, bench.after = [], []
        lat, part, wall = await clients(fn, n_clients, n_req)
        await services.aftercare.drain()  # the phase's deferred settlements count in its CPU
        await services.usage.flush()  # and its rows' database writes: none spill into the next phase
        into[mode]["steps"] += engine.stats().steps - steps0
        spans = clock.since(phase_t0)
        # per step: the time the engine waited for work before it (from the previous step's end)
        into[mode]["idle"].append([(b[0] - a[1]) * 1000 for a, b in zip(spans, spans[1:], strict=False)])
        into[mode]["step_ms"].append([(e - s0) * 1000 for s0, e in spans])
        if timeline is not None:
            timeline.end_phase(mode if into is results else f"{mode}, one client")
        into[mode]["cpu"].append((time.process_time() - cpu0) * 1000 / len(lat))
        into[mode]["loop_cpu"].append((time.thread_time() - tcpu0) * 1000 / len(lat))
        await mon.stop()
        current[0] = None
        r = into[mode]
        r["lat"] += lat
        r["part"] += part
        r["rounds"].append((pct(lat, 50), pct(lat, 99), pct(part, 50) if part else float("nan")))
        r["waited"] += bench.waited
        r["after"] += bench.after
        r["stall"] += mon.lateness
        r["wall"].append(wall)

    for _ in range(args.rounds):
        await phase("engine", bench.direct, args.clients, args.requests, results)
        await phase("engine+gateway", bench.wrapped, args.clients, args.requests, results)
        await phase("gateway alone", bench.alone, args.clients, args.requests * 10, results)
        if server is not None:  # the engine of this process is idle meanwhile
            lat: list[float] = []
            cpu0, t0 = server.cpu_s()[0], time.perf_counter()
            await asyncio.gather(*(http_client_loop(c, lat, args.requests) for c in http_clients))
            results["http"]["wall"].append(time.perf_counter() - t0)
            results["http"]["cpu"].append((server.cpu_s()[0] - cpu0) * 1000 / len(lat))
            results["http"]["lat"] += lat

    single = empty()
    if args.single:
        for _ in range(2):
            await phase("engine", bench.direct, 1, args.single // 2, single)
            await phase("engine+gateway", bench.wrapped, 1, args.single // 2, single)
    intervals = [float(v) for v in args.compare_switch_intervals.split(",")] if args.compare_switch_intervals else []
    by_interval = empty([f"{v:g}" for v in intervals])
    if intervals:
        chosen = sys.getswitchinterval()
        for _ in range(args.rounds):
            for v in intervals:
                sys.setswitchinterval(v / 1000)
                await phase(f"{v:g}", bench.direct, args.clients, args.requests, by_interval)
                await phase(f"{v:g}", bench.wrapped, args.clients, args.requests, by_interval)
        sys.setswitchinterval(chosen)
    if tracer is not None:
        tracer.stop()

    report(args, results, single, tracer)
    if timeline is not None:
        for mode in ("engine", "engine+gateway"):
            timeline.report(mode, clock.spans)
    if intervals:
        print(f"\nGIL switch intervals, interleaved round by round ({args.clients} clients; engine alone and "
              f"engine+gateway phases together):")
        print(f"{'interval ms':>12}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>8}{'loop stall max':>15}{'p99':>6}")
        for name, r in by_interval.items():
            print(f"{name:>12}{len(r['lat']):>6}{pct(r['lat'], 50):>9.2f}{pct(r['lat'], 99):>9.2f}"
                  f"{len(r['lat']) / sum(r['wall']):>8.1f}{max(r['stall']):>15.2f}{pct(r['stall'], 99):>6.2f}")

    undo_gc()
    await services.usage.flush()
    for c in http_clients:
        c.close()
    if server is not None:
        server.stop()
    keys = [k async for k in services.redis.scan_iter(match=settings.redis_prefix + "*")]
    if keys:
        await services.redis.delete(*keys)
    await ip_limiter.aclose()
    await services.close()
    await engine.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)  # kept, with the server's log, when the run failed


def _describe(lengths: tuple[int, int]) -> str:
    a, b = lengths
    return f"= {a}" if a == b else f"drawn from {a}..{b} (EOS ignored)"


def leave_out_arg(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in LEAVE_OUT]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"give a comma-separated list of {', '.join(LEAVE_OUT)}")
    return parts


def lengths_arg(text: str) -> tuple[int, int]:
    a, _, b = text.partition(":")
    lo, hi = int(a), int(b or a)
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError("give N or A:B with 1 <= A <= B")
    return lo, hi


def paired_report(engine_rounds: list[tuple], wrapped_rounds: list[tuple]) -> None:
    """The added latency round by round: each round's engine+gateway phase against the engine-alone
    phase just before it. The difference of the pooled medians above moves with the engine's speed
    from phase to phase; the median of the paired differences, next to how much the engine alone
    moves between its own rounds, says how much of a figure is noise."""
    if len(engine_rounds) < 2:
        return
    d50 = [w[0] - e[0] for e, w in zip(engine_rounds, wrapped_rounds, strict=True)]
    d99 = [w[1] - e[1] for e, w in zip(engine_rounds, wrapped_rounds, strict=True)]
    own = [e[0] for e in engine_rounds]
    inside = [w[2] for w in wrapped_rounds]
    print(f"  round by round ({len(d50)} rounds, each wrapped phase against the engine-alone phase before it): "
          f"added p50 median {statistics.median(d50):+.2f} ms (rounds {min(d50):+.1f} .. {max(d50):+.1f}), "
          f"p99 median {statistics.median(d99):+.2f} ms; the engine alone's own p50 ranges over "
          f"{max(own) - min(own):.1f} ms between rounds; inside the gateway's calls p50 {min(inside):.2f} .. "
          f"{max(inside):.2f} ms")


def steps_report(eng: dict, wrapped: dict) -> None:
    """The added latency counted in engine steps, which does not move with the engine's speed: a
    request needs one step per token; the steps that finish while it is out beyond those are steps
    it waited for (one in progress when it arrived, or one it missed while the gateway admitted it).
    Their difference between the phases, times the time a step takes, is what the gateway's delay
    costs in missed steps; the step time itself (engine busy all phase) shows the rest."""
    if not eng["waited"] or not wrapped["waited"] or not eng["steps"] or not wrapped["steps"]:
        return
    step_e = sum(eng["wall"]) * 1000 / eng["steps"]
    step_w = sum(wrapped["wall"]) * 1000 / wrapped["steps"]
    we, ww = statistics.fmean(eng["waited"]), statistics.fmean(wrapped["waited"])
    print(f"  engine steps each request waited beyond its own tokens, mean: engine alone {we:.3f}, with the "
          f"gateway {ww:.3f} ({ww - we:+.3f} steps = {(ww - we) * step_w:+.2f} ms at {step_w:.1f} ms per step); "
          f"phase wall time per engine step: alone {step_e:.1f} ms, with the gateway {step_w:.1f} ms ({step_w - step_e:+.1f})")


def cycle_report(eng: dict, wrapped: dict) -> None:
    """The added latency on the engine's own clock (``StepClock``): in waves every client has one
    request in each step, so a request's latency is one cycle, the time the engine waited for the
    wave (the clients' and the gateway's work between steps, the burst-gathering gap) plus the
    step itself. What the gateway adds is the change of the wait (its work on the critical path,
    free of the step time's noise) plus the change of the step (steps slowed by the gateway's work
    on the same cores: deferred settlements, the usage writer, Redis itself). Medians per phase,
    then round by round (each wrapped phase against the engine-alone phase before it). With
    staggered arrivals the engine rarely waits and the split says little."""
    rounds = [(statistics.median(ie), statistics.median(iw), statistics.median(se), statistics.median(sw))
              for ie, iw, se, sw in zip(eng["idle"], wrapped["idle"], eng["step_ms"], wrapped["step_ms"], strict=True)
              if ie and iw and se and sw]
    if not rounds:
        return
    d_idle = [r[1] - r[0] for r in rounds]
    d_step = [r[3] - r[2] for r in rounds]
    print(f"  on the engine's clock ({len(rounds)} rounds, medians per phase): wait for work before each step "
          f"alone {statistics.median(r[0] for r in rounds):.2f} ms, with the gateway "
          f"{statistics.median(r[1] for r in rounds):.2f} ms: added wait median {statistics.median(d_idle):+.2f} ms "
          f"(rounds {min(d_idle):+.2f} .. {max(d_idle):+.2f}); step time alone "
          f"{statistics.median(r[2] for r in rounds):.1f} ms, added median {statistics.median(d_step):+.2f} ms "
          f"(rounds {min(d_step):+.1f} .. {max(d_step):+.1f})")


def report(args: argparse.Namespace, results: dict, single: dict, tracer: StallTracer | None) -> None:
    base = results["engine"]["lat"]
    print(f"\n{'phase':<16}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'p50 x':>7}{'p99 x':>7}{'req/s':>8}"
          f"{'CPU ms/req':>11}{'req/step':>9}{'loop stall max':>15}{'p99':>6}")
    for mode, r in results.items():
        if not r["lat"]:
            continue
        lat = r["lat"]
        stall = r["stall"] or [0.0]
        cpu = f"{statistics.fmean(r['cpu']):.3f}" if r["cpu"] else "-"
        batch = f"{len(lat) / r['steps']:.1f}" if r["steps"] else "-"  # requests per engine step
        print(f"{mode:<16}{len(lat):>6}{pct(lat, 50):>9.2f}{pct(lat, 99):>9.2f}{pct(lat, 50) / pct(base, 50):>7.2f}"
              f"{pct(lat, 99) / pct(base, 99):>7.2f}{len(lat) / sum(r['wall']):>8.1f}{cpu:>11}"
              f"{batch:>9}"
              f"{max(stall):>15.2f}{pct(stall, 99):>6.2f}")

    eng, wrapped, alone = results["engine"], results["engine+gateway"], results["gateway alone"]
    own_cpu = statistics.fmean(alone["cpu"])
    added50 = pct(wrapped["lat"], 50) - pct(base, 50)
    added99 = pct(wrapped["lat"], 99) - pct(base, 99)
    part = wrapped["part"]
    loop_cpu_added = statistics.fmean(wrapped["loop_cpu"]) - statistics.fmean(eng["loop_cpu"])
    print(f"\nWith {args.clients} concurrent clients (targets: added p50 <= 2 ms, p99 <= 10 ms; stalls <= 10 ms):")
    print(f"  latency the gateway adds over the engine alone:  p50 {added50:+.2f} ms, p99 {added99:+.2f} ms "
          f"(engine alone p50 {pct(base, 50):.1f} ms, p99 {pct(base, 99):.1f} ms)")
    engine_part = [a - b for a, b in zip(wrapped["lat"], part, strict=True)]
    paired_report(eng["rounds"], wrapped["rounds"])
    steps_report(eng, wrapped)
    cycle_report(eng, wrapped)
    print(f"  the engine's part of a wrapped request: p50 {pct(engine_part, 50):.1f} ms "
          f"(alone {pct(base, 50):.1f} ms): arrivals spread by the gateway's work make smaller batches "
          f"({len(wrapped['lat']) / max(1, wrapped['steps']):.1f} requests per engine step vs "
          f"{len(base) / max(1, eng['steps']):.1f} alone)")
    after = wrapped["after"]
    before = [p - a for p, a in zip(part, after, strict=True)]
    print(f"  time each request spends inside the gateway's calls: p50 {pct(part, 50):.2f} ms, "
          f"p99 {pct(part, 99):.2f} ms, mean {statistics.fmean(part):.2f} ms; before the engine p50 "
          f"{pct(before, 50):.2f} ms, p99 {pct(before, 99):.2f} ms; after it p50 {pct(after, 50):.2f} ms, "
          f"p99 {pct(after, 99):.2f} ms")
    print(f"  of which the request's own work: {own_cpu:.3f} ms CPU per request (gateway alone, all threads of this "
          f"process; {loop_cpu_added:.3f} ms more event-loop-thread CPU per request than the engine alone); "
          f"the rest is waiting: for the other {args.clients - 1} requests' gateway work on the one event loop, "
          f"for Redis, and for the CPUs and the GIL held by the engine")
    print(f"  event-loop stalls while the engine steps: engine alone max {max(eng['stall'] or [0]):.1f} ms "
          f"(p99 {pct(eng['stall'], 99):.1f}); with the gateway max {max(wrapped['stall'] or [0]):.1f} ms "
          f"(p99 {pct(wrapped['stall'], 99):.1f})")
    print(f"  gateway alone (no engine): p50 {pct(alone['lat'], 50):.2f} ms, p99 {pct(alone['lat'], 99):.2f} ms at "
          f"{args.clients} concurrent = {len(alone['lat']) / sum(alone['wall']):.0f} requests/s on one event loop, "
          f"{own_cpu:.3f} ms CPU per request")
    if results["http"]["lat"]:
        h = results["http"]["lat"]
        print(f"  the whole product over HTTP (server in its own process: uvicorn + FastAPI + JSON + the above; "
              f"lean keep-alive client here): p50 {pct(h, 50) - pct(base, 50):+.2f} ms, p99 {pct(h, 99) - pct(base, 99):+.2f} ms "
              f"over the engine alone; server process {statistics.fmean(results['http']['cpu']):.3f} ms CPU per "
              f"request (engine included; engine alone {statistics.fmean(eng['cpu']):.3f})")
    if single["engine"]["lat"]:
        s_base, s_wr = single["engine"]["lat"], single["engine+gateway"]
        print(f"\nOne client ({len(s_base)} requests each): engine alone p50 {pct(s_base, 50):.2f} ms; "
              f"added p50 {pct(s_wr['lat'], 50) - pct(s_base, 50):+.2f} ms, p99 {pct(s_wr['lat'], 99) - pct(s_base, 99):+.2f} ms; "
              f"time inside the gateway's calls p50 {pct(s_wr['part'], 50):.2f} ms, p99 {pct(s_wr['part'], 99):.2f} ms")
    if tracer is not None:
        print(f"\nStall trace: {tracer.samples} samples while the loop was > 5 ms late")
        for title, sites in (("event-loop thread", tracer.loop_sites), ("engine thread", tracer.engine_sites)):
            print(f"  {title}:")
            for site, n in sites.most_common(8):
                print(f"    {n:>5}  {site}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=4, help="requests per client per round")
    ap.add_argument("--rounds", type=int, default=8,
                    help="rounds of interleaved phases (the added latency is also reported round by round)")
    ap.add_argument("--max-tokens", type=lengths_arg, default=(1, 1), metavar="N|A:B",
                    help="tokens per request (1: waves of 50 arrivals at once; A:B: lengths drawn from that range, "
                         "arrivals staggered)")
    ap.add_argument("--single", type=int, default=40, help="requests with one client (0: skip that phase)")
    ap.add_argument("--http", action="store_true", help="also measure the whole product over HTTP (own process)")
    ap.add_argument("--stall-trace", action="store_true", help="sample where the threads are during stalls")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="event loop (uvicorn uses uvloop when installed)")
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="GIL switch interval (default: the app's PAGEGATE_GIL_SWITCH_INTERVAL_MS; 5 = Python's)")
    ap.add_argument("--compare-switch-intervals", default="", metavar="MS,MS",
                    help="also run both engine phases at each of these GIL switch intervals, interleaved")
    ap.add_argument("--settle-delay-ms", type=float, default=None,
                    help="settle quota this long after the response (default: Settings'; 0: before)")
    ap.add_argument("--admission-gap-ms", type=float, default=None,
                    help="the engine's burst-gathering gap from idle (default: EngineConfig's; 0: off)")
    ap.add_argument("--admission-notice-gap-ms", type=float, default=None,
                    help="the engine's wait after the last announced request (default: EngineConfig's)")
    ap.add_argument("--engine-threads", type=int, default=None, help="torch threads of the engine (default: torch's)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--timeline", action="store_true",
                    help="print where a wave's time goes between engine steps (bench/wave_timeline.py)")
    ap.add_argument("--leave-out", type=leave_out_arg, default=(), metavar="PART,...",
                    help=f"ablation: skip these parts of the gateway's work ({', '.join(LEAVE_OUT)}) to see what "
                         f"they cost; the figures printed are then not the gateway's")
    cli = ap.parse_args()
    if cli.loop == "uvloop":
        import uvloop

        uvloop.run(main(cli))
    else:
        asyncio.run(main(cli))
