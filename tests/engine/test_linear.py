"""Dense layers through oneDNN's prepacked GEMM equal ``F.linear``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.linear import Linear, onednn_available, resolve_linear_backend

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear")
needs_onednn_bf16 = pytest.mark.skipif(not onednn_available(torch.bfloat16),
                                       reason="oneDNN's bf16 linear needs AVX-512 or AVX-NE-CONVERT on this CPU")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_equals_f_linear_fp32(rows, bias):
    torch.manual_seed(rows)
    w, x = torch.randn(96, 48), torch.randn(rows, 48)
    b = torch.randn(96) if bias else None
    got = Linear(w, b, backend="onednn")(x)
    torch.testing.assert_close(got, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


@needs_onednn_bf16
def test_onednn_bf16_and_3d_input():
    torch.manual_seed(0)
    w, x = torch.randn(64, 32).bfloat16(), torch.randn(2, 5, 32).bfloat16()
    got = Linear(w, backend="onednn")(x)
    assert got.shape == (2, 5, 64) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(x, w).float(), atol=0.1, rtol=0.02)


def test_backend_resolution():
    cpu = torch.device("cpu")
    assert resolve_linear_backend("torch", cpu, torch.float32) == "torch"
    assert resolve_linear_backend("auto", cpu, torch.float16) == "torch"  # oneDNN path is fp32/bf16 only
    assert resolve_linear_backend("auto", cpu, torch.float32) == ("onednn" if onednn_available() else "torch")
    bf16 = "onednn" if onednn_available(torch.bfloat16) else "torch"  # AVX2-only CPUs: fp32 only
    assert resolve_linear_backend("auto", cpu, torch.bfloat16) == bf16
    if bf16 == "torch":
        with pytest.raises(ValueError, match="bf16 also needs"):
            resolve_linear_backend("onednn", cpu, torch.bfloat16)
    with pytest.raises(ValueError):
        resolve_linear_backend("onednn", cpu, torch.float16)
    with pytest.raises(ValueError):
        resolve_linear_backend("mkl", cpu, torch.float32)


_SHAPES_SCRIPT = """
import sys
def rss_mb():  # the resident size now (ru_maxrss is no use here: a child keeps its parent's peak across exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) // 1024
import engine  # sets the oneDNN cache capacities unless set outside
import torch
from engine.linear import Linear, onednn_available
if not onednn_available():
    print("skip"); sys.exit(0)
torch.manual_seed(0)
layers = [Linear(torch.randn(o, i), backend="onednn") for o, i in ((576, 576), (1536, 576), (576, 1536))]
x, x2 = torch.randn(300, 576), torch.randn(300, 1536)
for m in range(1, 4):  # warm: the process's own size before the shapes vary
    for layer in layers:
        layer(x2[:m] if layer.weight.size(1) == 1536 else x[:m])
before = rss_mb()
for m in range(4, 260):  # a step's row count varies with the batch
    for layer in layers:
        layer(x2[:m].clone() if layer.weight.size(1) == 1536 else x[:m].clone())
print(rss_mb() - before)
"""


def test_onednn_caches_do_not_grow_with_every_row_count():
    """Found by a QA soak: oneDNN caches a primitive per input shape (1,024 by default), and the
    engine's row count varies step by step: ~1 GB more resident before it levelled off. Importing
    ``engine`` caps the caches (64) unless the environment sets them; measured against 1,024."""
    import os
    import subprocess
    import sys

    def growth_mb(**env: str) -> int | None:
        run_env = {k: v for k, v in os.environ.items()
                   if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
        run_env.update(env, OMP_NUM_THREADS="1")
        out = subprocess.run([sys.executable, "-c", _SHAPES_SCRIPT], env=run_env, capture_output=True, text=True,
                             timeout=300, check=True).stdout.split()
        return None if out[-1] == "skip" else int(out[-1])

    capped = growth_mb()
    if capped is None:
        pytest.skip("no oneDNN linear on this machine")
    default = growth_mb(ONEDNN_PRIMITIVE_CACHE_CAPACITY="1024", LRU_CACHE_CAPACITY="1024")
    assert default > 150 and capped < default / 3, (capped, default)
