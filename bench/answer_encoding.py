"""What building a large logprobs answer on a worker thread costs the event loop's thread: the
answer built and encoded with one pydantic call (``model_dump_json``) against the same answer
encoded in pieces (``gateway.formats.encode_in_pieces``, what the gateway does), alternated in one
process. The main thread sleeps 1 ms in a loop meanwhile, as the event loop waits; how late those
sleeps wake is what every other request would wait.

    python bench/answer_encoding.py [--choices 64] [--tokens 1000] [--top 20] [--rounds 3]

The entries are random (seeded) token ids and logprobs; token names are made up (no tokenizer
needed). Prints per round the seconds and the worst lateness of each way, then the medians and
their ratio. The GIL switch interval is the app's (1 ms).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.formats import CompletionFormat, TokenNames, encode_in_pieces, make_usage  # noqa: E402


def timed(build, encode) -> tuple[float, float, int]:  # noqa: ANN001
    """(seconds, worst sleep lateness in seconds, bytes) of ``encode(build())`` on a thread."""
    done = threading.Event()
    size: list[int] = []

    def work() -> None:
        size.append(len(encode(build())))
        done.set()

    worst = 0.0
    start = time.perf_counter()
    threading.Thread(target=work).start()
    while not done.is_set():
        t = time.perf_counter()
        time.sleep(0.001)
        worst = max(worst, time.perf_counter() - t - 0.001)
    return time.perf_counter() - start, worst, size[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--choices", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    sys.setswitchinterval(0.001)
    rng = random.Random(1)
    names = TokenNames(lambda ids: [f"tok{i}".encode() for i in ids])
    entries = [[(rng.randrange(49152), -rng.random() * 5,
                 [(rng.randrange(49152), -rng.random() * 5) for _ in range(args.top)]) for _ in range(args.tokens)]
               for _ in range(args.choices)]

    def build():  # noqa: ANN202 - a Completion
        fmt = CompletionFormat(model="m", token_names=names, echo=("p",) * args.choices, scored=True)
        return fmt.response(["x"] * args.choices, ["length"] * args.choices, make_usage(1, 1, 0), entries)

    ways = {"one call": lambda answer: answer.model_dump_json().encode(), "in pieces": encode_in_pieces}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    print(f"{args.choices} choices x {args.tokens} tokens x {args.top} alternatives", flush=True)
    for r in range(args.rounds):
        for name, encode in ways.items():
            seconds, worst, size = timed(build, encode)
            results[name].append((seconds, worst))
            print(f"  round {r + 1} {name:>9}: {size / 1e6:.1f} MB in {seconds:.2f} s, "
                  f"sleeps woke up to {worst * 1000:.1f} ms late", flush=True)
    med = {name: (statistics.median(s for s, _ in v), statistics.median(w for _, w in v)) for name, v in results.items()}
    for name, (seconds, worst) in med.items():
        print(f"{name:>9}: {seconds:.2f} s, worst lateness {worst * 1000:.1f} ms (medians)")
    (one_s, one_w), (pc_s, pc_w) = med["one call"], med["in pieces"]
    print(f"in pieces against one call: worst lateness {pc_w / one_w:.2f}x, time {pc_s / one_s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
