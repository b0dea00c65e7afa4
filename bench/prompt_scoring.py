"""What scoring a prompt costs the engine (``SamplingParams.prompt_logprobs``: what ``echo`` with
``logprobs`` and ``max_tokens: 0`` asks through ``/v1/completions``), against the same prompts'
plain prefill (one token generated) and against transformers scoring them (one forward per
prompt, log-softmax over the logits, the alternatives by ``topk``), alternated round by round in
one process on SmolLM2-135M.

    python bench/prompt_scoring.py [--prompts 16] [--tokens 256] [--rounds 3] [--top 5]

Every phase of every round gets prompts of its own (seeded random words), so the prefix cache
serves none of them. Prints prompt tokens per second per phase (median over the rounds), the
ratios, and how far pagegate's logprobs are from transformers' (max absolute difference).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.config import EngineConfig  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.weights import resolve_model_dir  # noqa: E402

WORDS = ("river stone light paper window garden music number silver market winter yellow "
         "engine letter mountain story table forest cloud bridge").split()


def prompts_for(tokenizer, rng: random.Random, count: int, tokens: int) -> list[list[int]]:  # noqa: ANN001
    out = []
    for _ in range(count):
        ids: list[int] = []
        while len(ids) < tokens:
            ids = tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(tokens)))
        out.append(ids[:tokens])
    return out


def run_engine(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list]:
    """Seconds to run every prompt to the end together; each prompt's logprobs (when scored)."""
    ids = [f"p{i}-{time.perf_counter_ns()}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, params)
    scored: dict[str, list] = {}
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.prompt_logprobs is not None:
                scored[out.request_id] = out.prompt_logprobs
    return time.perf_counter() - t0, [scored.get(rid) for rid in ids]


def run_hf(model, prompts: list[list[int]], top: int) -> tuple[float, list]:  # noqa: ANN001
    """transformers: one forward per prompt (no padding to waste), log-softmax, gather, top-k."""
    out = []
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids in prompts:
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            chosen = logp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
            values, indices = logp.topk(top, dim=-1)
            out.append((chosen.tolist(), indices.tolist(), values.tolist()))
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--weights-cache-dir", default=str(REPO / "data" / "weights"))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM

    model_dir = resolve_model_dir(args.model, args.weights_cache_dir)
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", max_num_batched_tokens=2048))
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    rng = random.Random(1)
    plain = SamplingParams(temperature=0, max_tokens=1)
    scoring = SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=args.top)
    total = args.prompts * args.tokens
    print(f"{args.prompts} prompts x {args.tokens} tokens, top {args.top}, {args.rounds} rounds; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    run_engine(engine, prompts_for(engine.tokenizer, rng, 2, 32), scoring)  # warm-up
    times: dict[str, list[float]] = {"prefill": [], "scored": [], "transformers": []}
    worst = 0.0
    for r in range(args.rounds):
        seconds, _ = run_engine(engine, prompts_for(engine.tokenizer, rng, args.prompts, args.tokens), plain)
        times["prefill"].append(seconds)
        batch = prompts_for(engine.tokenizer, rng, args.prompts, args.tokens)
        seconds, ours = run_engine(engine, batch, scoring)
        times["scored"].append(seconds)
        seconds, theirs = run_hf(hf, batch, args.top)
        times["transformers"].append(seconds)
        for got, (chosen, _, values) in zip(ours, theirs, strict=True):
            worst = max(worst, max(abs(e[0] - c) for e, c in zip(got[1:], chosen, strict=True)),
                        max(abs(a[1] - b) for e, v in zip(got[1:], values, strict=True)
                            for a, b in zip(e[1], v, strict=True)))
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1] * 1000:.0f} ms" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:>13}: {total / v:8.0f} prompt tokens/s ({v * 1000:.0f} ms)")
    print(f"scoring against the plain prefill: {med['scored'] / med['prefill']:.2f}x the time; "
          f"against transformers scoring the same prompts: {med['transformers'] / med['scored']:.2f}x faster")
    print(f"largest difference from transformers' logprobs: {worst:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
