"""The CPU's native kernels, compiled at first use and called through ctypes (which releases
the GIL for the call): decode attention (``csrc/cpu_attention.c``) and the fused fp32 layers
around it (``csrc/cpu_layers.c``: RMSNorm with the residual add, SiLU*up, RoPE + cache write).

Decode rows (one new token per sequence) read K/V straight from the paged cache through the
block table, one OpenMP work item per sequence: no gather copy, no mask, no merge.
Prefill chunks keep the torch path (``kernels.torch_ops``), whose fused SDPA is the better fit
for many query rows. When no C compiler is found the build fails once, quietly, and callers
fall back to the torch path (``available()`` says which).

The shared library is cached under ``$PAGEGATE_KERNEL_CACHE`` or ``~/.cache/pagegate/kernels``,
keyed by a hash of the sources, the flags, the compiler and the CPU (it is built with
``-march=native``), and written atomically, so concurrent processes never load a half-written file.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = [_CSRC / "cpu_attention.c", _CSRC / "cpu_layers.c"]
_HEADERS = [_CSRC / "cpu_math.h"]
# -march=native: this machine's vector width (AVX-512 here); reassociation lets the compiler
# vectorize the dot-product sums; no -ffast-math, whose finite-math assumption would drop the
# kernel's -inf checks.
_FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno", "-fassociative-math",
          "-fno-signed-zeros", "-fno-trapping-math", "-shared", "-fPIC", "-std=c11"]
_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None
_FAILED = False


def _cache_dir() -> Path:
    root = os.environ.get("PAGEGATE_KERNEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pagegate", "kernels"
    )
    return Path(root)


def _cpu_signature() -> bytes:
    """This CPU's model and feature flags (Linux), or the platform's name elsewhere."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith((b"model name", b"flags"))]
        return b"\n".join(sorted(set(lines)))
    except OSError:
        import platform

        return f"{platform.machine()} {platform.processor()}".encode()


def _build() -> ctypes.CDLL:
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    src = b"".join(p.read_bytes() for p in _SOURCES + _HEADERS)
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    # -march=native: a library built on one CPU must never be loaded on another (a shared home)
    key = hashlib.sha256(src + " ".join(_FLAGS).encode() + version.encode() + _cpu_signature()).hexdigest()[:16]
    target = _cache_dir() / f"pagegate_cpu-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            cmd = [cc, *_FLAGS, "-o", tmp, *map(str, _SOURCES), "-lm"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"compiling the CPU kernels failed: {proc.stderr.strip()[:500]}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(target))
    i64, i32, f32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    for name in ("pg_paged_decode_f32", "pg_paged_decode_bf16"):
        fn = getattr(lib, name)
        fn.restype = i32
        fn.argtypes = [ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, i32, i32, i32, i32, i32, f32, i32]
    signatures = {
        "pg_rms_norm": [ptr, ptr, ptr, i32, i32, f32, i32],
        "pg_add_rms_norm": [ptr, ptr, ptr, ptr, i32, i32, f32, i32],
        "pg_silu_mul": [ptr, ptr, i32, i32, i32],
        "pg_rope_cache": [ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32],
        "pg_rope_cache_bf16": [ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = i32, argtypes
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled library, or None when it cannot be built here (logged once)."""
    global _LIB, _FAILED
    if _LIB is None and not _FAILED:
        with _LOCK:
            if _LIB is None and not _FAILED:
                try:
                    _LIB = _build()
                except (OSError, RuntimeError) as exc:
                    _FAILED = True
                    log.warning("native CPU attention unavailable, using the torch path: %s", exc)
    return _LIB


def available() -> bool:
    return library() is not None


def supports(query: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """Shapes and dtypes the C kernel takes: fp32 or bf16 cache, head_dim <= 256, <= 64 query
    heads, block_size <= 64."""
    hq, d = query.shape[1], query.shape[2]
    bs, hkv = key_cache.shape[1], key_cache.shape[2]
    return (
        query.device.type == "cpu" and key_cache.dtype in (torch.float32, torch.bfloat16)
        and d <= 256 and bs <= 64 and hq <= 64 and hq % hkv == 0
    )


def paged_decode(query, key_cache, value_cache, seq_lens, block_tables, scale, max_seq_len=None) -> torch.Tensor:
    """``query [B, Hq, D]`` (one token per sequence) -> ``[B, Hq, D]`` in the query's dtype.
    (``max_seq_len`` is accepted for the torch decode path's signature; the kernel needs none.)"""
    lib = library()
    b, hq, d = query.shape
    q = query.float()
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    out = torch.empty((b, hq, d), dtype=torch.float32)
    kc, vc = key_cache.contiguous(), value_cache.contiguous()
    tables = block_tables if block_tables.dtype == torch.int32 else block_tables.int()
    tables = tables.contiguous()
    lens = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.int()
    lens = lens.contiguous()
    fn = lib.pg_paged_decode_f32 if kc.dtype == torch.float32 else lib.pg_paged_decode_bf16
    rc = fn(
        q.data_ptr(), q.stride(0), kc.data_ptr(), vc.data_ptr(), tables.data_ptr(), tables.stride(0),
        lens.data_ptr(), out.data_ptr(), b, hq, kc.shape[2], d, kc.shape[1], float(scale),
        torch.get_num_threads(),
    )
    if rc != 0:
        raise RuntimeError("native decode attention rejected its shapes")
    return out if query.dtype == torch.float32 else out.to(query.dtype)


# ---- fused fp32 layers (contiguous CPU tensors; the model checks ``layers_supported`` once) ----
def layers_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Activations are fp32 in these kernels; the weights (``dtype``) and KV cache may be bf16."""
    return dtype in (torch.float32, torch.bfloat16) and device.type == "cpu" and available()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()  # the kernels walk raw rows: a view would be read wrong (no-op normally)
    t, h = x.shape
    out = torch.empty_like(x)
    _LIB.pg_rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), t, h, eps, torch.get_num_threads())
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``residual += x`` in place; returns ``rms_norm(residual) * weight``."""
    if not residual.is_contiguous():
        raise ValueError("add_rms_norm updates the residual in place: it must be contiguous")
    x = x.contiguous()
    t, h = x.shape
    out = torch.empty_like(x)
    _LIB.pg_add_rms_norm(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), out.data_ptr(), t, h, eps,
                         torch.get_num_threads())
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``[T, 2I]`` (gate | up) -> ``silu(gate) * up`` ``[T, I]``."""
    gate_up = gate_up.contiguous()
    t, two_i = gate_up.shape
    out = torch.empty((t, two_i // 2), dtype=gate_up.dtype)
    _LIB.pg_silu_mul(gate_up.data_ptr(), out.data_ptr(), t, two_i // 2, torch.get_num_threads())
    return out


def rope_and_write_kv(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Rotate q and k of the fused QKV rows ``[T, (Hq + 2 Hkv) * D]`` by ``positions``; write k and v
    into their cache slots (fp32 or bf16); return q ``[T, Hq, D]``. ``cos``/``sin``: ``[max_pos, D]``."""
    if qkv.stride(1) != 1:
        qkv = qkv.contiguous()
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("the KV cache must be contiguous: it is written in place")
    positions, slot_mapping = positions.long().contiguous(), slot_mapping.long().contiguous()
    t = qkv.shape[0]
    q = torch.empty((t, num_heads, head_dim), dtype=qkv.dtype)
    fn = _LIB.pg_rope_cache if key_cache.dtype == torch.float32 else _LIB.pg_rope_cache_bf16
    fn(qkv.data_ptr(), qkv.stride(0), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(),
       key_cache.data_ptr(), value_cache.data_ptr(), slot_mapping.data_ptr(), t, num_heads, num_kv_heads,
       head_dim, torch.get_num_threads())
    return q
