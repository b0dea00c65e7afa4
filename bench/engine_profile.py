"""Quick engine profile (not the official benchmark, see bench/engine_throughput.py): the chat
workload of issue 2 scaled down, timing pagegate's step loop and where a step's time goes.

    .venv/bin/python bench/engine_profile.py [--requests 64] [--max-tokens 256] [--dtype float32]
                                             [--profile]   # torch profiler table of one run
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

SYSTEM = (
    "You are a helpful, precise assistant for a software company. Answer the user's question "
    "clearly and briefly. If you do not know, say so. Prefer short paragraphs and concrete "
    "examples. Never invent APIs, flags or numbers; when a detail is uncertain, point the user to "
    "the documentation instead. Keep a friendly, professional tone, avoid jargon unless the user "
    "uses it first, and format code in fenced blocks with the language named."
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batched-tokens", type=int, default=512)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--hf", action="store_true", help="also time HF static batched generate (one batch)")
    args = ap.parse_args()

    engine = LLMEngine(EngineConfig(dtype=args.dtype, max_num_batched_tokens=args.batched_tokens))
    tok = engine.tokenizer
    rng = random.Random(0)
    prompts, params = [], []
    for i in range(args.requests):
        msgs = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Question {i}: how do I use feature number {rng.randint(1, 999)}?"}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        params.append(SamplingParams(temperature=0.0, ignore_eos=True,
                                     max_tokens=rng.randint(min(16, args.max_tokens), args.max_tokens)))
    print(f"system prompt ~{len(prompts[0])} tokens, threads={torch.get_num_threads()}")
    engine.generate([prompts[0]], [SamplingParams(temperature=0.0, max_tokens=4)])  # warm-up

    prof = None
    if args.profile:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    dt = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    n_out = sum(map(len, outs))
    n_in = sum(map(len, prompts))
    s = engine.stats()
    print(f"pagegate: output tok/s {n_out / dt:.1f}  total tok/s {(n_out + n_in) / dt:.1f}  ({n_out} tokens in "
          f"{dt:.1f}s, {s.steps} steps, prefix hit rate {s.prefix_hit_rate:.2%}, preemptions {s.preemptions})")
    if args.hf:
        hf = hf_static(engine.model_dir, prompts, params, tok)
        print(f"HF static batch of {len(prompts)}: output tok/s {n_out / hf:.1f} ({hf:.1f}s); "
              f"pagegate / HF = {hf / dt:.2f}x")


def hf_static(model_dir, prompts, params, tok) -> float:
    """Seconds for HF transformers' batched greedy generate (left padding, one batch, every
    request to the longest max_tokens; only each request's own tokens are counted)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    width = max(map(len, prompts))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    longest = max(p.max_tokens for p in params)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                       do_sample=False, pad_token_id=pad)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
