"""pagegate's in-process LLM engine: paged KV cache, prefix sharing, continuous batching.

Light names (config, params, outputs, errors) import eagerly; ``LLMEngine`` and ``AsyncEngine``
load torch and are imported on first use, so ``import engine.config`` stays cheap.
"""

import os as _os

from engine.config import EngineConfig
from engine.outputs import (
    CompletionDelta,
    EngineClassFullError,
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    EngineStats,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
)
from engine.sampling_params import SamplingParams

# oneDNN (the CPU linear layers, ``engine.linear``) caches a primitive per input shape, and a step's
# row count varies from 1 to the batched-token limit: with the caches' default 1,024 entries a
# process serving varied prompt lengths grew ~1 GB resident before it levelled off (found by a QA
# soak). 64 entries keep the shapes in use; the engine benchmark ran alike (268.5 against 269.3
# output tok/s). Set before the first primitive is made (read once); a value set outside is kept.
for _name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    _os.environ.setdefault(_name, "64")


__all__ = [
    "AsyncEngine",
    "CompletionDelta",
    "EngineClassFullError",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineOverloadedError",
    "EngineStats",
    "LLMEngine",
    "PromptTooLongError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]


def __getattr__(name: str):
    if name == "LLMEngine":
        from engine.llm_engine import LLMEngine

        return LLMEngine
    if name == "AsyncEngine":
        from engine.async_engine import AsyncEngine

        return AsyncEngine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
