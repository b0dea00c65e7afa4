"""Ahead-of-time compilation of the real (non-interpreted) kernels for an H100/H200 (sm_90).

The interpreter checks the kernels' arithmetic but not that they lower to GPU code: loop-carried
types, ``tl.dot`` shape and dtype rules and shared-memory limits are only checked by the compiler.
Triton's wheel ships ``ptxas``, so the whole chain (TTIR -> TTGIR -> LLVM -> PTX -> cubin) runs on a
machine without a GPU. It runs in a subprocess because this test session imported the kernels under
``TRITON_INTERPRET=1``; the subprocess also checks that compiled kernels refuse CPU tensors clearly. Skipped on CUDA machines, where the other tests run the kernels for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the kernels run for real")

ROOT = Path(__file__).resolve().parents[2]

COMPILE_SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.triton_attention import _paged_attention_kernel, _reduce_splits_kernel, _tile_sizes
from kernels.triton_cache import _write_kv_cache_kernel

INT_PTRS = {"block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "slot_mapping_ptr"}
FP32_PTRS = {"part_acc_ptr", "part_max_ptr", "part_sum_ptr"}

def compile_sm90(fn, constexprs, data):
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*i32" if name in INT_PTRS else "*fp32" if name in FP32_PTRS else "*" + data
        else:
            sig[name] = "fp32" if name == "scale_log2" else "i32"
    c = triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    return {"cubin_bytes": len(c.asm["cubin"]), "shared": c.metadata.shared}

results = {}
for data, group, head_dim, splits in json.loads(sys.argv[1]):
    gp = triton.next_power_of_2(group)
    block_q, tile_n = _tile_sizes(gp, head_dim, 1 if splits > 1 else 64)
    results[f"attn-{data}-g{group}-d{head_dim}-s{splits}"] = compile_sm90(_paged_attention_kernel, dict(
        NUM_Q_HEADS=3 * group, GROUP=group, GROUP_PAD=gp, HEAD_DIM=head_dim, DIM_PAD=head_dim,
        BLOCK_SIZE=16, BLOCK_Q=block_q, TILE_N=tile_n, NUM_SPLITS=splits,
        DOT_PRECISION="ieee" if data == "fp32" else "tf32", DOT_IN_FP32=False), data)
results["reduce"] = compile_sm90(_reduce_splits_kernel, dict(
    NUM_Q_HEADS=9, HEAD_DIM=64, DIM_PAD=64, NUM_SPLITS=5, SPLITS_PAD=8), "bf16")
results["cache"] = compile_sm90(_write_kv_cache_kernel, dict(
    NUM_KV_HEADS=3, HEAD_DIM=64, BLOCK_SIZE=16, HEADS_PAD=4, DIM_PAD=64), "bf16")

# compiled (not interpreted) kernels handed CPU tensors must refuse clearly
import torch
from kernels.triton_attention import paged_attention_triton
try:
    paged_attention_triton(torch.zeros(1, 1, 16), torch.zeros(1, 16, 1, 16), torch.zeros(1, 16, 1, 16),
                           query_start_loc=torch.tensor([0, 1]), seq_lens=torch.tensor([1]),
                           block_tables=torch.zeros(1, 1, dtype=torch.int32), scale=1.0)
    results["cpu_refusal"] = ""
except RuntimeError as exc:
    results["cpu_refusal"] = str(exc)
print(json.dumps(results))
"""

VARIANTS = [("bf16", 3, 64, 1), ("fp16", 4, 128, 4), ("fp32", 8, 128, 1)]


def test_kernels_compile_to_sm90_cubin():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE_SCRIPT, json.dumps(VARIANTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "TRITON_INTERPRET=1" in results.pop("cpu_refusal")
    assert len(results) == len(VARIANTS) + 2
    for name, info in results.items():
        assert info["cubin_bytes"] > 0, name
        assert info["shared"] <= 227 * 1024, f"{name} needs {info['shared']} B of shared memory"
