"""One tenant's slow JSON schemas against another tenant's small ones on the gateway's schema thread.

A *heavy* tenant keeps ``--heavy`` requests in flight, each with a distinct schema of three
patterned strings with a ``minLength`` (~0.1 s to compile here, within the compiler's bounds); a
*light* tenant sends a small distinct schema every ``--every`` seconds. The light tenant's compile
latency and the heavy tenant's compiles per second are measured with the gateway's schema thread
shared in turns (``gateway.schema_thread.compile_in_turn``, this tree) and first come, first served
(one thread as before: ``run_in_executor`` on ``engine.json_schema.compiler_thread``), phases
alternated in one process.

    .venv/bin/python bench/schema_fairness.py [--seconds 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.embedder_fairness import pct  # noqa: E402
from engine.json_schema import compile_schema, compiler_thread  # noqa: E402
from gateway.schema_thread import compile_in_turn  # noqa: E402


def heavy_schema() -> str:
    pattern = "^[a-z]{0,50}[0-9]{0,50}[A-Z]{0,50}$"
    props = {f"p{i}": {"type": "string", "pattern": pattern, "minLength": 60} for i in range(3)}
    props["tag"] = {"const": uuid.uuid4().hex}  # distinct: compiled schemas are remembered by text
    return json.dumps({"type": "object", "properties": props, "required": list(props), "additionalProperties": False})


def light_schema() -> str:
    props = {"n": {"type": "integer"}, "tag": {"const": uuid.uuid4().hex}}
    return json.dumps({"type": "object", "properties": props, "required": list(props), "additionalProperties": False})


async def fifo(_share: str, text: str):  # noqa: ANN202 - the code before: one thread, first come first served
    return await asyncio.get_running_loop().run_in_executor(compiler_thread(), compile_schema, text)


async def phase(compile_fn, args) -> tuple[list[float], float]:  # noqa: ANN001
    stop = time.perf_counter() + args.seconds
    light: list[float] = []
    heavy_done = [0]

    async def heavy() -> None:
        while time.perf_counter() < stop:
            await compile_fn("heavy", heavy_schema())
            heavy_done[0] += 1

    async def one_light() -> None:
        t0 = time.perf_counter()
        await compile_fn("light", light_schema())
        light.append((time.perf_counter() - t0) * 1000)

    async def light_tenant() -> None:
        await asyncio.sleep(0.3)
        pending = []
        while time.perf_counter() < stop:
            pending.append(asyncio.ensure_future(one_light()))
            await asyncio.sleep(args.every)
        await asyncio.gather(*pending)

    t0 = time.perf_counter()
    await asyncio.gather(light_tenant(), *(heavy() for _ in range(args.heavy)))
    return light, heavy_done[0] / (time.perf_counter() - t0)


async def main(args) -> None:  # noqa: ANN001
    t0 = time.perf_counter()
    compile_schema(heavy_schema())
    print(f"one heavy schema compiles in {(time.perf_counter() - t0) * 1000:.0f} ms; heavy tenant {args.heavy} "
          f"in flight, light tenant one small schema every {args.every * 1000:.0f} ms; {args.seconds:.0f} s a "
          f"phase, {args.rounds} rounds", flush=True)
    got: dict[str, list] = {"in turns": [], "first come": []}
    for r in range(args.rounds):
        for name in (("in turns", "first come") if r % 2 == 0 else ("first come", "in turns")):
            light, rate = await phase(compile_in_turn if name == "in turns" else fifo, args)
            got[name].append((light, rate))
            print(f"  round {r + 1} {name:10s}: light p50 {pct(light, .5):7.1f} ms p99 {pct(light, .99):7.1f} ms, "
                  f"heavy {rate:5.1f} schemas/s", flush=True)
    turns = [x for light, _ in got["in turns"] for x in light]
    first = [x for light, _ in got["first come"] for x in light]
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        a, b = pct(turns, q), pct(first, q)
        print(f"light tenant's compile {label}: in turns {a:7.1f} ms, first come {b:7.1f} ms, "
              f"first come / in turns {b / a:6.2f}x")
    ra = sum(rate for _, rate in got["in turns"]) / args.rounds
    rb = sum(rate for _, rate in got["first come"]) / args.rounds
    print(f"heavy tenant: in turns {ra:.1f} schemas/s, first come {rb:.1f} schemas/s ({ra / rb:.2f}x)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--heavy", type=int, default=8, help="the heavy tenant's requests in flight")
    ap.add_argument("--every", type=float, default=0.05, help="seconds between the light tenant's schemas")
    asyncio.run(main(ap.parse_args()))
