"""Times the Triton kernels against the torch reference path and the memory-bandwidth bound.

For each case (decode batches, long-context decodes with and without split-KV, prefill chunks over
a cached prefix, a mixed batch, the cache write) it prints one row:

    triton ms | torch ms (gather + SDPA) | speedup | K/V MB read | bound ms | % of bound | max |diff|

``bound ms`` is the time to move the bytes the operation must touch (K/V of every context once,
plus Q and the output; for the cache write the rows read and written) at the device's bandwidth,
measured in the same run with a large device-to-device copy (or given with ``--bandwidth-gbs``).
For prefill the FLOP bound (``--peak-tflops``, measured with a bf16 matmul) is shown when it is the
larger one. ``--dry-run`` runs tiny shapes on the CPU under ``TRITON_INTERPRET=1`` to exercise the
script; its timings mean nothing.

    python bench/kernel_bench.py                 # CUDA, bf16
    python bench/kernel_bench.py --dry-run       # CPU interpreter, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The interpreter must be chosen before triton decorates the kernels.
if "--dry-run" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels.reference import write_kv_cache_ref  # noqa: E402
from kernels.triton_attention import paged_attention_triton  # noqa: E402
from kernels.triton_cache import write_kv_cache_triton  # noqa: E402

MODELS = {  # name: (num_q_heads, num_kv_heads, head_dim)
    "smollm2": (9, 3, 64),
    "llama8b": (32, 8, 128),
}


@dataclass(slots=True)
class Case:
    name: str
    model: str
    q_lens: list[int]
    seq_lens: list[int]
    num_kv_splits: int | None = None  # None: the heuristic decides
    block_size: int = 16


@dataclass(slots=True)
class Row:
    case: str
    triton_ms: float
    torch_ms: float
    kv_mb: float
    bound_ms: float
    bound_kind: str
    max_diff: float

    @property
    def speedup(self) -> float:
        return self.torch_ms / self.triton_ms

    @property
    def pct_of_bound(self) -> float:
        return 100.0 * self.bound_ms / self.triton_ms


def gpu_cases() -> list[Case]:
    return [
        Case("decode smollm2 256x512", "smollm2", [1] * 256, [512] * 256),
        Case("decode smollm2 64x2048", "smollm2", [1] * 64, [2048] * 64),
        Case("decode llama8b 64x1024", "llama8b", [1] * 64, [1024] * 64),
        Case("decode llama8b 4x16k split=auto", "llama8b", [1] * 4, [16384] * 4),
        Case("decode llama8b 4x16k split=1", "llama8b", [1] * 4, [16384] * 4, num_kv_splits=1),
        Case("decode llama8b 1x32k split=auto", "llama8b", [1], [32768]),
        Case("decode llama8b 1x32k split=1", "llama8b", [1], [32768], num_kv_splits=1),
        Case("prefill llama8b 4x512 over 1536", "llama8b", [512] * 4, [2048] * 4),
        Case("mixed smollm2 48 dec@2048 + 256 over 1024", "smollm2", [1] * 48 + [256], [2048] * 48 + [1280]),
        Case("decode llama8b 32x1000 bs32", "llama8b", [1] * 32, [1000] * 32, block_size=32),
    ]


def dry_run_cases() -> list[Case]:
    return [
        Case("decode smollm2 3x40", "smollm2", [1] * 3, [40] * 3),
        Case("decode smollm2 2x150 split=4", "smollm2", [1, 1], [150, 150], num_kv_splits=4),
        Case("prefill smollm2 2x20 over 10", "smollm2", [20, 20], [30, 30]),
        Case("mixed smollm2 2 dec + 9 over 7", "smollm2", [1, 1, 9], [33, 17, 16]),
    ]


def build_batch(case: Case, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict:
    """Random Q and a paged cache whose blocks are handed out in shuffled order."""
    hq, hkv, d = MODELS[case.model]
    bs = case.block_size
    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks_per_seq = [-(-s // bs) for s in case.seq_lens]
    num_blocks = sum(blocks_per_seq)
    key_cache = torch.randn((num_blocks, bs, hkv, d), dtype=dtype, device=device)
    value_cache = torch.randn((num_blocks, bs, hkv, d), dtype=dtype, device=device)
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros((len(case.seq_lens), max(blocks_per_seq)), dtype=torch.int32)
    start = 0
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = perm[start:start + n].to(torch.int32)
        start += n
    qsl = [0]
    for q in case.q_lens:
        qsl.append(qsl[-1] + q)
    return dict(
        query=torch.randn((qsl[-1], hq, d), dtype=dtype, device=device),
        key_cache=key_cache, value_cache=value_cache,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(case.seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        scale=d**-0.5,
        max_query_len=max(case.q_lens), max_seq_len=max(case.seq_lens),
    )


class GatherSDPA:
    """The torch path a GPU user would write without a paged kernel: gather each sequence's K/V
    through its block table into a padded batch, one SDPA call with a causal-with-prefix mask,
    then unpad. Per-step metadata (indices, mask) is built once, like the engine would per step."""

    def __init__(self, b: dict, case: Case) -> None:
        dev = b["query"].device
        bs = b["key_cache"].shape[1]
        lmax, qmax = max(case.seq_lens), max(case.q_lens)
        pos = torch.arange(lmax, device=dev)
        blocks = b["block_tables"].long().gather(1, (pos // bs).expand(len(case.seq_lens), -1).clamp(
            max=b["block_tables"].shape[1] - 1))
        self.slots = blocks * bs + pos % bs  # [B, Lmax]
        seq_lens = b["seq_lens"].long()
        q_lens = torch.tensor(case.q_lens, device=dev)
        j = torch.arange(qmax, device=dev)
        q_pos = (seq_lens - q_lens)[:, None] + j[None, :]  # [B, Qmax]
        self.mask = (pos[None, None, :] <= q_pos[:, :, None]) & (pos[None, None, :] < seq_lens[:, None, None])
        self.mask = self.mask[:, None]  # [B, 1, Qmax, Lmax]
        self.valid = j[None, :] < q_lens[:, None]  # [B, Qmax] rows that are real tokens
        self.dest = (b["query_start_loc"][:-1].long()[:, None] + j[None, :])[self.valid]
        self.b, self.qmax = b, qmax

    def __call__(self) -> torch.Tensor:
        b = self.b
        q = b["query"]
        hq, d = q.shape[1:]
        kc, vc = b["key_cache"], b["value_cache"]
        hkv = kc.shape[2]
        k = kc.view(-1, hkv, d)[self.slots].transpose(1, 2)  # [B, Hkv, L, D]
        v = vc.view(-1, hkv, d)[self.slots].transpose(1, 2)
        qp = q.new_zeros((self.valid.shape[0], self.qmax, hq, d))
        qp[self.valid] = q[self.dest]
        out = F.scaled_dot_product_attention(qp.transpose(1, 2), k, v, attn_mask=self.mask,
                                             scale=b["scale"], enable_gqa=True)
        flat = torch.empty_like(q)
        flat[self.dest] = out.transpose(1, 2)[self.valid]
        return flat


def time_ms(fn, device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()  # warm-up
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure_bandwidth_gbs(device: torch.device) -> float:
    """Device-to-device copy of a large buffer, counting bytes read + written."""
    n = (2 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    return 2 * n / (ms * 1e-3) / 1e9


def measure_peak_tflops(device: torch.device) -> float:
    n = 8192 if device.type == "cuda" else 256
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn((n, n), dtype=dtype, device=device)
    b = torch.randn((n, n), dtype=dtype, device=device)
    ms = time_ms(lambda: a @ b, device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def attention_row(case: Case, dtype, device, bw_gbs: float, peak_tflops: float) -> Row:
    b = build_batch(case, dtype, device)
    hq, hkv, d = MODELS[case.model]
    el = b["query"].element_size()
    kwargs = {k: b[k] for k in ("query_start_loc", "seq_lens", "block_tables", "scale",
                                "max_query_len", "max_seq_len")}

    def run_triton():
        return paged_attention_triton(b["query"], b["key_cache"], b["value_cache"], **kwargs,
                                      num_kv_splits=case.num_kv_splits)

    torch_path = GatherSDPA(b, case)
    diff = (run_triton().float() - torch_path().float()).abs().max().item()
    triton_ms = time_ms(run_triton, device)
    torch_ms = time_ms(torch_path, device)
    kv_bytes = sum(case.seq_lens) * hkv * d * 2 * el
    io_bytes = kv_bytes + 2 * b["query"].numel() * el
    mem_ms = io_bytes / (bw_gbs * 1e9) * 1e3
    # causal FLOPs: each new token j of a sequence attends to (prefix + j + 1) keys
    flops = sum(4 * hq * d * (q * (s - q) + q * (q + 1) // 2) for q, s in zip(case.q_lens, case.seq_lens, strict=True))
    flop_ms = flops / (peak_tflops * 1e12) * 1e3
    bound_ms, kind = (mem_ms, "mem") if mem_ms >= flop_ms else (flop_ms, "flop")
    return Row(case.name, triton_ms, torch_ms, kv_bytes / 1e6, bound_ms, kind, diff)


def cache_write_row(num_tokens: int, model: str, dtype, device, bw_gbs: float) -> Row:
    _, hkv, d = MODELS[model]
    bs = 16
    num_blocks = -(-num_tokens // bs) * 2
    key = torch.randn((num_tokens, hkv, d), dtype=dtype, device=device)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * bs, device=device)[:num_tokens]
    slots[::7] = -1  # padding tokens
    caches = [torch.zeros((num_blocks, bs, hkv, d), dtype=dtype, device=device) for _ in range(4)]
    write_kv_cache_triton(key, value, caches[0], caches[1], slots)
    write_kv_cache_ref(key, value, caches[2], caches[3], slots)
    diff = max((caches[0].float() - caches[2].float()).abs().max().item(),
               (caches[1].float() - caches[3].float()).abs().max().item())
    triton_ms = time_ms(lambda: write_kv_cache_triton(key, value, caches[0], caches[1], slots), device)
    torch_ms = time_ms(lambda: write_kv_cache_ref(key, value, caches[2], caches[3], slots), device)
    kept = int((slots >= 0).sum())
    moved = 2 * 2 * kept * hkv * d * key.element_size()  # K and V, read + written
    return Row(f"cache write {model} {num_tokens} tok", triton_ms, torch_ms, moved / 2 / 1e6,
               moved / (bw_gbs * 1e9) * 1e3, "mem", diff)


def format_table(rows: list[Row], header: str) -> str:
    lines = [
        header,
        f"| {'case':44} | triton ms | torch ms | speedup | K/V MB | bound ms | % of bound | max abs diff |",
        f"| {'-' * 44} | --------: | -------: | ------: | -----: | -------: | ---------: | -----------: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.case:44} | {r.triton_ms:9.3f} | {r.torch_ms:8.3f} | {r.speedup:6.1f}x | {r.kv_mb:6.1f} "
            f"| {r.bound_ms:8.3f} | {r.pct_of_bound:9.0f}% {r.bound_kind[0]} | {r.max_diff:12.2e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU interpreter")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--bandwidth-gbs", type=float, help="memory bandwidth (default: measured)")
    parser.add_argument("--peak-tflops", type=float, help="dense matmul peak (default: measured)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)

    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available: use --dry-run on a CPU machine")
    dtype = getattr(torch, args.dtype) if not args.dry_run else torch.float32
    torch.manual_seed(0)
    bw = args.bandwidth_gbs or measure_bandwidth_gbs(device)
    peak = args.peak_tflops or measure_peak_tflops(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton interpreter)"

    rows = []
    for case in dry_run_cases() if args.dry_run else gpu_cases():
        rows.append(attention_row(case, dtype, device, bw, peak))
        print(f"  done: {case.name}", file=sys.stderr, flush=True)
    for model, tokens in ([("smollm2", 16)] if args.dry_run else [("smollm2", 4096), ("llama8b", 8192)]):
        rows.append(cache_write_row(tokens, model, dtype, device, bw))

    header = (f"Kernels on {name}, {str(dtype).removeprefix('torch.')}, bandwidth {bw:.0f} GB/s, "
              f"matmul peak {peak:.3g} TFLOP/s (bound: m = bytes / bandwidth, f = FLOPs / peak)")
    print(format_table(rows, header))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"device": name, "dtype": str(dtype), "bandwidth_gbs": bw, "peak_tflops": peak,
             "rows": [asdict(r) | {"speedup": r.speedup, "pct_of_bound": r.pct_of_bound} for r in rows]},
            indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
