"""The engine's configuration: a small dataclass that checks itself. The gateway's settings
build it; the engine reads nothing from the environment."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
MAX_THREADS = 1024  # torch intra-op threads at most (libgomp allocates per thread: 1e9 aborted)


_KINDS: dict[str, tuple[type, ...]] = {
    "model": (str,), "served_model_name": (str,), "weights_cache_dir": (str,), "device": (str,), "dtype": (str,),
    "block_size": (numbers.Integral,), "kv_cache_memory_gb": (numbers.Real,), "num_blocks": (numbers.Integral,),
    "max_model_len": (numbers.Integral,), "max_num_batched_tokens": (numbers.Integral,),
    "max_num_seqs": (numbers.Integral,), "max_waiting": (numbers.Integral,),
    "max_waiting_per_class": (numbers.Integral,), "admission_gap_ms": (numbers.Real,),
    "admission_max_wait_ms": (numbers.Real,), "admission_notice_gap_ms": (numbers.Real,),
    "enable_prefix_caching": (bool,), "attention_backend": (str,), "num_threads": (numbers.Integral,),
    "linear_backend": (str,), "seed": (numbers.Integral,),
}
_OPTIONAL = frozenset({"served_model_name", "num_blocks", "max_model_len", "max_waiting_per_class", "num_threads",
                       "seed"})
_KIND_NAMES = {str: "text", numbers.Integral: "an integer", numbers.Real: "a number", bool: "true or false"}


@dataclass(slots=True)
class EngineConfig:
    model: str = "smollm2-135m-instruct"  # bundled id, or a local HF directory (config.json + safetensors)
    served_model_name: str | None = None  # id the API shows; defaults to the bundled id or dir name
    weights_cache_dir: str = "./data/weights"  # converted GGUF weights are cached here
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"  # "auto" (fp32 on CPU, bf16 on CUDA) | "float32" | "bfloat16" | "float16"
    block_size: int = 16
    kv_cache_memory_gb: float = 1.0  # memory budget of the KV pool; sets num_blocks
    num_blocks: int | None = None  # overrides the budget when set (tests)
    max_model_len: int | None = None  # defaults to the model's context length
    max_num_batched_tokens: int = 512  # token budget per step
    max_num_seqs: int = 64  # cap on running requests
    max_waiting: int = 1024  # beyond this, generate() raises EngineOverloadedError
    # requests one scheduling class (the gateway's tenant) may have waiting; beyond it, generate()
    # raises EngineClassFullError, so that one class cannot fill the queue for all (None: a quarter
    # of max_waiting, at least 1). Requests without a class are not counted
    max_waiting_per_class: int | None = None
    # AsyncEngine, woken from idle: wait while requests keep arriving within this gap (0: off) ...
    admission_gap_ms: float = 1.0
    admission_max_wait_ms: float = 10.0  # ... but never longer than this
    # ... and for announced requests (AsyncEngine.announce), until the last is in and then this long
    admission_notice_gap_ms: float = 0.2
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"  # "auto" | "native" (C decode kernel, CPU) | "torch" | "triton"
    num_threads: int | None = None  # torch intra-op threads on CPU
    linear_backend: str = "auto"  # "auto" (oneDNN prepacked GEMM on CPU) | "onednn" | "torch" (F.linear)
    # the source of the seeds of requests that send none; None: a fresh one each start (unseeded
    # sampling differs between runs, as OpenAI's does; found by QA: every start drew the same answers)
    seed: int | None = None

    @property
    def class_waiting_cap(self) -> int:
        """``max_waiting_per_class``, or its default."""
        return self.max_waiting_per_class or max(1, self.max_waiting // 4)

    def __post_init__(self) -> None:
        # each field of its kind (found by QA: max_num_seqs=1.5 and seed="x" were taken, and failed
        # later with a bare TypeError; enable_prefix_caching="no" counted as on)
        for name, kinds in _KINDS.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
                what = " or ".join(_KIND_NAMES[k] for k in kinds) + (" (or unset)" if name in _OPTIONAL else "")
                raise ValueError(f"{name} must be {what}, not {value!r}")
            if numbers.Real in kinds:
                setattr(self, name, float(value))
            elif numbers.Integral in kinds:
                setattr(self, name, int(value))  # (a NumPy integer: as Python's)
        if self.block_size not in (8, 16, 32, 64):
            raise ValueError("block_size must be one of 8, 16, 32, 64")
        if not (math.isfinite(self.kv_cache_memory_gb) and self.kv_cache_memory_gb > 0):  # (NaN compares false)
            raise ValueError("kv_cache_memory_gb must be a finite number > 0")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise ValueError("num_blocks must be >= 2")
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError("max_num_batched_tokens must be >= block_size")
        for name in ("admission_gap_ms", "admission_max_wait_ms", "admission_notice_gap_ms"):
            wait = getattr(self, name)
            if not (math.isfinite(wait) and wait >= 0):  # (found by QA: NaN passed `< 0`; the step loop crashed)
                raise ValueError(f"{name} must be a finite number >= 0")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:  # a prompt token and one to generate
            raise ValueError("max_model_len must be >= 2 (or unset: the model's context length)")
        if self.max_waiting < 1:
            raise ValueError("max_waiting must be >= 1")
        if self.max_waiting_per_class is not None and self.max_waiting_per_class < 1:
            raise ValueError("max_waiting_per_class must be >= 1 (or unset: a quarter of max_waiting)")
        if self.num_threads is not None and not 1 <= self.num_threads <= MAX_THREADS:
            raise ValueError(f"num_threads must be between 1 and {MAX_THREADS} (or unset: torch's default)")
        if self.device != "auto" and not _DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        if self.attention_backend not in ("auto", "native", "torch", "triton"):
            raise ValueError("attention_backend must be auto, native, torch or triton")
        if self.linear_backend not in ("auto", "onednn", "torch"):
            raise ValueError("linear_backend must be auto, onednn or torch")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError("dtype must be auto, float32, bfloat16 or float16")
