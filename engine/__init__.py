"""pagegate's in-process LLM engine: paged KV cache, prefix sharing, continuous batching.

Light names (config, params, outputs, errors) import eagerly; ``LLMEngine`` and ``AsyncEngine``
load torch and are imported on first use, so ``import engine.config`` stays cheap.
"""

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
