"""A wave's quota settlements as the aftercare runs them (``RequestAccount._finish`` hands each
request's settlement to ``services.aftercare``; its batch runs ~20 ms after the responses, while the
engine steps), against an earlier revision's code in the same process: that revision's
``gateway/quota.py`` and ``gateway/aftercare.py`` are loaded from git (``--baseline-rev``, by
default 288739f: a coroutine per settlement, so a task per request in the aftercare's batch, and
the cost in 1e-8 USD units through a ``Decimal``). Both settle the same kind of reservations
(made by their own ledger just before, not timed) on real Redis, alternately, wave after wave;
the figures are the event loop's CPU (``time.thread_time``) from the first hand-over to the end of
the batch, per settlement, and Redis's own time per settlement (``INFO commandstats``: the growth
of ``EVALSHA``'s time over the batch; the baseline runs that revision's ``quota_settle.lua``, so
nothing else may use this Redis server during the run). Redis's time matters while the engine
steps: on a machine whose cores also run the model, the settlement script competes with it.

    python bench/settlement.py [--waves 300] [--wave 50] [--baseline-rev REV]

Needs Redis (PAGEGATE_REDIS_URL, default redis://127.0.0.1:6379/2; a unique key prefix is used
and deleted). Prints µs per settlement (medians of the waves) for each and the ratios."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.usage_row import load_revision  # noqa: E402
from gateway.aftercare import Aftercare  # noqa: E402
from gateway.ids import new_hex_id  # noqa: E402
from gateway.settings import Settings  # noqa: E402

MODEL = "smollm2-135m-instruct"


async def main(args: argparse.Namespace) -> None:
    from gateway import tenancy as svc
    from gateway.tenancy_services import build_tenancy

    old_quota = load_revision(args.baseline_rev, "gateway/quota.py", "settlement_base_quota")
    old_aftercare = load_revision(args.baseline_rev, "gateway/aftercare.py", "settlement_base_aftercare")
    tmp = Path(tempfile.mkdtemp(prefix="pagegate-bench-"))
    url = os.environ.get("PAGEGATE_REDIS_URL", "redis://127.0.0.1:6379/2")
    settings = Settings(database_url=f"sqlite+aiosqlite:///{tmp / 'bench.db'}", redis_url=url,
                        redis_prefix=f"pgbench:{new_hex_id()[:8]}:", data_dir=str(tmp),
                        usage_spool_dir=str(tmp / "spool"), load_engine=False, cache_enabled=False)
    services = await build_tenancy(settings, redis_url=url, upgrade_schema=True)
    try:
        async with services.db.sessionmaker() as s:
            tenant = await svc.create_tenant(s, name="bench", rpm=0, tpm=10**9, budget_tokens=10**12)
            _, new = await svc.create_api_key(s, tenant_id=tenant.id)
            await svc.set_price(s, model=MODEL, prompt_usd_per_1m="0.1", completion_usd_per_1m="0.2")
            await s.commit()
        principal = await services.auth.authenticate(f"Bearer {new.key}")
        this_quota = services.quota
        base_quota = old_quota.QuotaLedger(services.redis, services.db.sessionmaker, services.prices,
                                           prefix=settings.redis_prefix)
        base_quota._settle = services.redis.register_script(subprocess.run(  # that revision's script too
            ["git", "show", f"{args.baseline_rev}:gateway/lua/quota_settle.lua"], cwd=ROOT, check=True,
            capture_output=True, text=True).stdout)

        async def evalsha_usec() -> int:
            return int((await services.redis.info("commandstats"))["cmdstat_evalsha"]["usec"])
        this_care, base_care = Aftercare(0.02), old_aftercare.Aftercare(0.02)

        async def base_settle(reservation) -> None:  # noqa: ANN001 - as that revision's RequestAccount._settle
            try:
                await base_quota.settle(reservation, prompt_tokens=33, completion_tokens=1)
            except Exception:  # noqa: BLE001
                pass

        def hand_over_base(reservations: list) -> None:
            for r in reservations:
                base_care.submit(lambda r=r: base_settle(r))

        def hand_over_this(reservations: list) -> None:
            for r in reservations:  # as RequestAccount._finish does it now
                this_care.submit(lambda r=r: this_quota.settle_soon(r, prompt_tokens=33, completion_tokens=1),
                                 f"(quota settlement of {r.id})")

        sides = {"this": (this_quota, this_care, hand_over_this), "baseline": (base_quota, base_care, hand_over_base)}
        figures: dict[str, list[float]] = {name: [] for name in sides}
        in_redis: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.waves):
            for name, (quota, care, hand_over) in sides.items():
                wave = await asyncio.gather(*(quota.reserve(principal, model=MODEL, prompt_tokens=33, max_tokens=1)
                                              for _ in range(args.wave)))
                await asyncio.sleep(0)
                r0 = await evalsha_usec()
                t0 = time.thread_time()
                hand_over(wave)
                await care.drain()
                figures[name].append((time.thread_time() - t0) * 1e6 / args.wave)
                in_redis[name].append((await evalsha_usec() - r0) / args.wave)
                if not all(r.settled for r in wave):
                    raise SystemExit(f"{name}: a settlement did not happen")
        this, base = statistics.median(figures["this"]), statistics.median(figures["baseline"])
        print(f"{args.waves} waves of {args.wave} settlements, alternated; event-loop CPU per settlement, median:")
        print(f"  this code                 {this:6.2f} µs")
        print(f"  baseline {args.baseline_rev:<16} {base:6.2f} µs")
        print(f"  ratio baseline / this     {base / this:6.2f}x")
        this, base = statistics.median(in_redis["this"]), statistics.median(in_redis["baseline"])
        print("Redis's time per settlement (its script's share of the batch), median:")
        print(f"  this code                 {this:6.2f} µs")
        print(f"  baseline {args.baseline_rev:<16} {base:6.2f} µs")
        print(f"  ratio baseline / this     {base / this:6.2f}x")
    finally:
        keys = [k async for k in services.redis.scan_iter(match=settings.redis_prefix + "*")]
        if keys:
            await services.redis.delete(*keys)
        await services.close()
    shutil.rmtree(tmp, ignore_errors=True)  # kept when the run failed


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--waves", type=int, default=300)
    ap.add_argument("--wave", type=int, default=50, help="settlements per wave (one aftercare batch)")
    ap.add_argument("--baseline-rev", default="288739f")
    cli = ap.parse_args()
    import uvloop

    uvloop.run(main(cli))
