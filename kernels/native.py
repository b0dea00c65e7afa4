"""The CPU's native decode attention: ``csrc/cpu_attention.c``, compiled at first use and called
through ctypes (which releases the GIL for the call).

Decode rows (one new token per sequence) read K/V straight from the paged cache through the
block table, one OpenMP work item per sequence: no gather copy, no mask, no merge.
Prefill chunks keep the torch path (``kernels.torch_ops``), whose fused SDPA is the better fit
for many query rows. When no C compiler is found the build fails once, quietly, and callers
fall back to the torch path (``available()`` says which).

The shared library is cached under ``$PAGEGATE_KERNEL_CACHE`` or ``~/.cache/pagegate/kernels``,
keyed by a hash of the source, the flags and the compiler, and written atomically, so
concurrent processes never load a half-written file.
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

_SOURCE = Path(__file__).with_name("csrc") / "cpu_attention.c"
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


def _build() -> ctypes.CDLL:
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    src = _SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256(src + " ".join(_FLAGS).encode() + version.encode()).hexdigest()[:16]
    target = _cache_dir() / f"cpu_attention-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            proc = subprocess.run([cc, *_FLAGS, "-o", tmp, str(_SOURCE), "-lm"], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"compiling {_SOURCE.name} failed: {proc.stderr.strip()[:500]}")
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
