"""Requests behind one long cached system prompt: the prefill cascade against the plain path.

An application sends the same system prompt with every request; after the first, the prompt's
KV blocks are prefix-cache hits (``prompt_tokens_details.cached_tokens``) and each request only
computes its own tokens. This times waves of such requests arriving together (one engine step
each) with the CPU attention's prefill cascade (``kernels.torch_ops._prefill_cascade``: the shared
blocks attended once for every chunk) and, alternated in the same process, with it switched off
(each chunk gathers and attends the whole prompt by itself), and checks that both give the same
greedy tokens.

    python bench/shared_prefix.py [--system-tokens 1000] [--requests 50] [--rounds 3] [--dtype float32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import kernels.torch_ops as torch_ops  # noqa: E402
from bench.gateway_http import SYSTEM_SENTENCE  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()

    engine = LLMEngine(EngineConfig(model="smollm2-135m-instruct", device="cpu", dtype=args.dtype,
                                    num_blocks=2048, max_model_len=4096, max_num_seqs=max(64, args.requests),
                                    max_num_batched_tokens=4096))
    system = SYSTEM_SENTENCE * max(1, args.system_tokens // 17)  # ~17 tokens a sentence

    def prompt(question: str) -> list[int]:
        ids = engine.tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": question}],
            add_generation_prompt=True, tokenize=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"])

    params = SamplingParams(max_tokens=1, temperature=0.0)
    real = torch_ops._prefill_cascade

    def wave(prompts: list[list[int]], cascade: bool, salt: str) -> tuple[float, list[list[int]], int]:
        """One wave: every request's question is new (only the system prompt is cached); each path
        has its own prefix-cache salt, so neither reuses the other's blocks."""
        torch_ops._prefill_cascade = real if cascade else (lambda *a, **k: False)
        try:
            for i, p in enumerate(prompts):
                engine.add_request(f"{salt}-{i}", p, params, salt=salt)
            steps, outputs, t0 = 0, {}, time.perf_counter()
            while engine.has_unfinished_requests():
                for out in engine.step():
                    outputs.setdefault(out.request_id, []).extend(t for d in out.deltas for t in d.token_ids)
                steps += 1
            return (time.perf_counter() - t0) * 1000, [outputs[f"{salt}-{i}"] for i in range(len(prompts))], steps
        finally:
            torch_ops._prefill_cascade = real

    for salt in ("cascade", "plain"):  # the system prompt's blocks cached under each path's salt
        engine.add_request(f"warm-{salt}", prompt("Hello."), params, salt=salt)
        while engine.has_unfinished_requests():
            engine.step()
    times: dict[bool, list[float]] = {True: [], False: []}
    differ = 0
    n_tokens = 0
    for r in range(-1, args.rounds):  # round -1 warms both paths up
        prompts = [prompt(f"Question {r}.{i}: say hi.") for i in range(args.requests)]
        n_tokens = len(prompts[0])
        outs = {}
        for cascade in ((True, False) if r % 2 == 0 else (False, True)):
            ms, outs[cascade], steps = wave(prompts, cascade, f"{'cascade' if cascade else 'plain'}")
            if r >= 0:
                times[cascade].append(ms / steps)
        if r >= 0:
            differ += sum(a != b for a, b in zip(outs[True], outs[False], strict=True))
    stats = engine.stats()
    cascade_ms, plain_ms = statistics.median(times[True]), statistics.median(times[False])
    print(f"{args.requests} requests a wave, prompts of ~{n_tokens} tokens sharing a ~{args.system_tokens}-token "
          f"system prompt (prefix-cache hit rate {stats.prefix_hit_rate:.1%}), {args.dtype}, {args.rounds} rounds:")
    print(f"  per engine step: plain path {plain_ms:.0f} ms, cascade {cascade_ms:.0f} ms "
          f"-> {plain_ms / cascade_ms:.2f}x faster (rounds: plain {[round(t) for t in times[False]]}, "
          f"cascade {[round(t) for t in times[True]]})")
    print(f"  greedy tokens that differ between the two paths: {differ} of {args.requests * args.rounds}")


if __name__ == "__main__":
    main()
