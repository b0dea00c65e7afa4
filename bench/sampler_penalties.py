"""Cost of the sampler's penalties and logit_bias, as ratios against baselines measured in the same run.

For a batch of ``--batch`` sequences with ``--prompt`` + ``--output`` tokens each over a
``--vocab``-wide vocabulary, times ``Sampler.sample`` (greedy) per step with:

    none        no penalty (the common case: penalties are skipped entirely)
    rep-loop    repetition_penalty applied one row at a time (the former implementation)
    rep         repetition_penalty, batched
    pres+freq   presence_penalty + frequency_penalty, batched
    all         the three together
    bias5       logit_bias on 5 tokens per row (a classifier's answer tokens)
    bias1024    logit_bias on 1,024 tokens per row (the most a request may bias)

and ``all`` and ``bias5`` again with ``scratch=True`` (``*-inplace``: what the engine does while no
request asks for logprobs: the penalties write into the logits instead of a copy), so the copy's
share shows as a ratio in the same run.

    .venv/bin/python bench/sampler_penalties.py [--batch 64] [--vocab 49152] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.request import Request, RequestId, Sequence
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams


class RowLoopSampler(Sampler):
    """The former per-row repetition penalty (no presence/frequency), as the baseline."""

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence], *, scratch: bool = False) -> torch.Tensor:
        cloned = False
        for i, seq in enumerate(seqs):
            p = seq.params
            if p.repetition_penalty == 1.0:
                continue
            if not cloned:
                logits, cloned = logits.clone(), True
            ids = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=logits.device)
            vals = logits[i, ids]
            logits[i, ids] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        return logits


def make_batch(args: argparse.Namespace, **penalties: float) -> list[Sequence]:
    gen = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(args.batch):
        prompt = torch.randint(0, args.vocab, (args.prompt,), generator=gen).tolist()
        seq = Request(RequestId(f"b{i}"), prompt, SamplingParams(temperature=0.0, **penalties)).sequences[0]
        seq.token_ids += torch.randint(0, args.vocab, (args.output,), generator=gen).tolist()
        seqs.append(seq)
    return seqs


def per_step_ms(sampler: Sampler, logits: torch.Tensor, seqs: list[Sequence], steps: int, *,
                scratch: bool = False) -> float:
    if scratch:
        logits = logits.clone()  # written at each step (the values drift; the work is the same)
    sampler.sample(logits, seqs, scratch=scratch)  # warm-up
    if logits.is_cuda:
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(steps):
            sampler.sample(logits, seqs, scratch=scratch)
        if logits.is_cuda:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / steps * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--prompt", type=int, default=100)
    ap.add_argument("--output", type=int, default=200)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    logits = torch.randn(args.batch, args.vocab, generator=torch.Generator().manual_seed(1)).to(args.device)
    every = dict(repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)
    bias5 = dict(logit_bias={t: 5.0 for t in range(5)})
    cases = [
        ("none", Sampler(), {}, False),
        ("rep-loop", RowLoopSampler(), dict(repetition_penalty=1.1), False),
        ("rep", Sampler(), dict(repetition_penalty=1.1), False),
        ("pres+freq", Sampler(), dict(presence_penalty=0.5, frequency_penalty=0.5), False),
        ("all", Sampler(), every, False),
        ("all-inplace", Sampler(), every, True),
        ("bias5", Sampler(), bias5, False),
        ("bias5-inplace", Sampler(), bias5, True),
        ("bias1024", Sampler(), dict(logit_bias={t: 1.0 for t in range(min(1024, args.vocab))}), False),
    ]
    print(f"batch {args.batch}, vocab {args.vocab}, {args.prompt} prompt + {args.output} output tokens "
          f"per sequence, {args.device}, {torch.get_num_threads()} CPU threads")
    times = {name: per_step_ms(s, logits, make_batch(args, **kw), args.steps, scratch=scratch)
             for name, s, kw, scratch in cases}
    for name, ms in times.items():
        print(f"{name:>13}: {ms:8.2f} ms/step   x{ms / times['none']:.2f} vs none"
              f"   x{ms / times['rep-loop']:.2f} vs rep-loop")
    for name in ("all", "bias5"):
        print(f"{name} in place: x{times[name + '-inplace'] / times[name]:.2f} of its time with the copy")


if __name__ == "__main__":
    main()
