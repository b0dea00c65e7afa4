"""What showing logprobs costs the gateway's event loop: a streamed chunk and a whole answer with
logprobs (``gateway.formats``: names memoised per token id, entries built as plain dicts) against
the same chunk and answer without them, built and encoded to JSON, alternated in one process on
SmolLM2's tokenizer.

    python bench/logprobs_format.py [--rounds 5] [--chunks 2000] [--tokens 1024]

Token ids and their alternatives are drawn at random over the vocabulary (seeded); each round
names them once first, as a running gateway names a token once per process. Prints µs per chunk, ms per whole
answer, and each ratio against the plain one, for 0, 5 and 20 alternatives.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.tokenizer import ChatRenderer, load_tokenizer  # noqa: E402
from engine.weights import resolve_model_dir  # noqa: E402
from gateway.formats import ChatFormat, CompletionFormat, TokenNames, make_usage  # noqa: E402


def per_chunk(fmt, entries: list | None, n: int) -> float:  # noqa: ANN001
    """µs to build and encode one text chunk (with ``entries[i]``'s logprobs, or none)."""
    t0 = time.perf_counter()
    for i in range(n):
        fmt.text_chunk(0, "word", None if entries is None else [entries[i % len(entries)]]).model_dump_json()
    return (time.perf_counter() - t0) / n * 1e6


def whole(fmt, entries: list | None, tokens: int) -> float:  # noqa: ANN001
    """ms to build and encode a whole one-choice answer of ``tokens`` tokens."""
    t0 = time.perf_counter()
    fmt.response(["word " * tokens], ["length"], make_usage(10, tokens, 0),
                 None if entries is None else [entries[:tokens]]).model_dump_json()
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=1024)
    args = ap.parse_args()
    renderer = ChatRenderer(load_tokenizer(resolve_model_dir("smollm2-135m-instruct", "./data/weights")))
    rng = random.Random(0)
    vocab = 49_152
    base = [(rng.randrange(vocab), -rng.random() * 5, tuple((rng.randrange(vocab), -rng.random() * 8)
                                                            for _ in range(20))) for _ in range(args.tokens)]
    for fmt_cls in (ChatFormat, CompletionFormat):
        print(f"{fmt_cls.__name__} (medians of {args.rounds} rounds):")
        for k in (0, 5, 20):
            entries = [(t, lp, top[:k]) for t, lp, top in base]
            chunk, chunk_plain, full, full_plain = [], [], [], []
            for _ in range(args.rounds):
                names = TokenNames(renderer.token_bytes)
                names.of([e[0] for e in entries] + [t for e in entries for t, _ in e[2]])  # named once
                chunk_plain.append(per_chunk(fmt_cls(model="m"), None, args.chunks))
                chunk.append(per_chunk(fmt_cls(model="m", token_names=names), entries, args.chunks))
                full_plain.append(whole(fmt_cls(model="m"), None, args.tokens))
                full.append(whole(fmt_cls(model="m", token_names=names), entries, args.tokens))
            c, cp = statistics.median(chunk), statistics.median(chunk_plain)
            w, wp = statistics.median(full), statistics.median(full_plain)
            print(f"  {k:2d} alternatives: chunk {c:6.1f} µs vs {cp:5.1f} µs without logprobs ({c / cp:4.1f}x); "
                  f"whole {args.tokens}-token answer {w:7.1f} ms vs {wp:5.2f} ms ({w / wp:5.0f}x)")


if __name__ == "__main__":
    main()
