"""The usage row as the request path builds it, against an earlier revision's code in the same
process: ``Price.cost`` for the request's tokens, the ``UsageEvent``, and its journal line
(``to_json``). The earlier revision's ``gateway/usage.py`` and ``gateway/pricing.py`` are loaded
from git (``--baseline-rev``, by default fc79f7f: Decimal costs and an ISO ``created_at``, with
``datetime.now`` taken per row as ``gateway.accounting`` did); both run alternately, round after
round, on the same rows.

    python bench/usage_row.py [--rows 20000] [--rounds 15] [--baseline-rev REV]

Prints µs per row (median of the rounds) for each and the ratio baseline / this."""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway import pricing, usage  # noqa: E402


def load_revision(rev: str, path: str, name: str) -> ModuleType:
    """``path`` as it was at ``rev``, imported as module ``name``."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module


def rows(n: int, seed: int = 1) -> list[tuple]:
    rng = random.Random(seed)
    return [(f"req_{rng.getrandbits(128):032x}", rng.randint(1, 50), rng.randint(1, 200), rng.randint(1, 2000),
             rng.randint(0, 512), rng.randint(1, 256), rng.uniform(5, 900), rng.uniform(1, 90),
             rng.choice(("stop", "length"))) for _ in range(n)]


def run_this(batch: list[tuple], price) -> float:  # noqa: ANN001
    event_cls = usage.UsageEvent
    t0 = time.perf_counter()
    for rid, tenant, key, prompt, cached, completion, latency, ttft, finish in batch:
        cost = price.cost(prompt, completion)
        event_cls(request_id=rid, tenant_id=tenant, api_key_id=key, model="smollm2-135m-instruct",
                  endpoint="chat.completions", prompt_tokens=prompt, cached_prompt_tokens=cached,
                  completion_tokens=completion, cost_usd=cost, saved_usd=Decimal(0), latency_ms=latency,
                  ttft_ms=ttft, status="ok", finish_reason=finish, cache="miss").to_json()
    return time.perf_counter() - t0


def run_baseline(batch: list[tuple], price, event_cls) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    for rid, tenant, key, prompt, cached, completion, latency, ttft, finish in batch:
        cost = price.cost(prompt, completion)
        event_cls(request_id=rid, created_at=datetime.now(UTC), tenant_id=tenant, api_key_id=key,
                  model="smollm2-135m-instruct", endpoint="chat.completions", prompt_tokens=prompt,
                  cached_prompt_tokens=cached, completion_tokens=completion, cost_usd=cost, saved_usd=Decimal(0),
                  latency_ms=latency, ttft_ms=ttft, status="ok", finish_reason=finish, cache="miss").to_json()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--baseline-rev", default="fc79f7f")
    args = ap.parse_args()
    old_usage = load_revision(args.baseline_rev, "gateway/usage.py", "baseline_usage")
    old_pricing = load_revision(args.baseline_rev, "gateway/pricing.py", "baseline_pricing")
    prompt_usd, completion_usd = Decimal("0.15"), Decimal("0.60")
    price, old_price = pricing.Price(prompt_usd, completion_usd), old_pricing.Price(prompt_usd, completion_usd)
    batch = rows(args.rows)
    for r in batch[:200]:  # the same costs (the rows differ only in their time field)
        assert price.cost(r[3], r[5]) == old_price.cost(r[3], r[5])
    this, base = [], []
    for i in range(args.rounds):
        order = [("this", lambda: run_this(batch, price)),
                 ("baseline", lambda: run_baseline(batch, old_price, old_usage.UsageEvent))]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            (this if name == "this" else base).append(fn() / len(batch) * 1e6)
    t, b = statistics.median(this), statistics.median(base)
    print(f"usage row (cost + event + journal line), {args.rows:,} rows x {args.rounds} rounds, alternated")
    print(f"  this       {t:6.2f} µs/row   (rounds {min(this):.2f} .. {max(this):.2f})")
    print(f"  baseline   {b:6.2f} µs/row   ({args.baseline_rev}; rounds {min(base):.2f} .. {max(base):.2f})")
    print(f"  baseline / this: {b / t:.2f}x")


if __name__ == "__main__":
    main()
