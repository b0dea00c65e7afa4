"""What the engine hands back: per-step deltas of each request, and its stats."""

from __future__ import annotations

import asyncio
import numbers
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.sampling_params import SamplingParams


@dataclass(slots=True)
class CompletionDelta:
    """New output of one choice (``index`` < n) since the previous ``RequestOutput``."""

    index: int
    text: str  # whole characters (an answer cut inside one ends with U+FFFD), never part of a stop string
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" once finished
    num_tokens: int = 0  # completion tokens of this choice so far
    # with ``SamplingParams.logprobs``: per token of ``token_ids``, (its logprob, the most likely
    # tokens at that position as ((token id, logprob), ...), most likely first); a closing EOS
    # or special stop token, which has no text, has none (the list is one shorter)
    logprobs: list[TokenLogprob] | None = None


TokenLogprob = tuple[float, tuple[tuple[int, float], ...]]


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    queue_time: float | None = None  # seconds from arrival to first scheduling
    ttft: float | None = None  # seconds from arrival to first output token
    inter_token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    deltas: list[CompletionDelta]
    prompt_tokens: int
    cached_prompt_tokens: int  # prompt tokens served from the prefix cache
    finished: bool
    metrics: RequestMetrics | None = None
    # with ``SamplingParams.prompt_logprobs``, in the request's first output only: per prompt
    # token its entry (``CompletionDelta.logprobs``' shape, then the token's rank: 1 for the most
    # likely), None for the first token
    prompt_logprobs: list[tuple[float, tuple[tuple[int, float], ...], int] | None] | None = None


@dataclass(slots=True)
class EngineStats:
    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_usage: float  # fraction of blocks in use
    kv_utilization: float  # tokens held / slots of the allocated blocks (0.0 with none allocated)
    prefix_hit_rate: float  # prompt tokens served from cache / prompt tokens looked up
    preemptions: int
    steps: int
    generated_tokens: int


class EngineError(Exception):
    """Base of errors the engine raises for a request (the gateway maps them to HTTP)."""


class PromptTooLongError(EngineError, ValueError):
    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"This model's maximum context length is {max_model_len} tokens, but the request "
            f"has {prompt_tokens} prompt tokens."
        )


class EngineOverloadedError(EngineError):
    """The waiting queue is full; retry later."""


class EngineClassFullError(EngineOverloadedError):
    """This request's scheduling class (the gateway's tenant) already has its share of the waiting
    queue (``EngineConfig.max_waiting_per_class``); retry later."""


class EngineDeadError(EngineError):
    """The engine's step loop stopped on an unexpected error."""


class EngineStoppingError(EngineError):
    """The server is shutting down: the request was stopped before it finished (``interrupt_all``)."""


def check_salt(salt: object) -> None:
    """A prefix-cache salt is None or text that UTF-8 can hold (found by QA: ``salt=123`` or a lone
    surrogate passed ``generate`` and crashed the step loop for every request)."""
    if salt is None:
        return
    if not isinstance(salt, str):
        raise ValueError("salt must be a string")
    try:
        salt.encode()
    except UnicodeEncodeError:
        raise ValueError("salt must be valid Unicode text (no lone surrogates)") from None


def check_prompt(ids: list[int], params: SamplingParams, max_model_len: int, vocab: int | None,
                 salt: str | None = None) -> None:
    """Raise what an engine raises for a prompt it cannot take: ``PromptTooLongError`` when it
    leaves no room for one token (with ``max_tokens`` 0: when it is longer than the context),
    ``ValueError`` for an empty prompt, token ids that are not integers (found by QA: floats
    crashed the step loop) or outside the vocabulary (the prompt's, ``stop_token_ids``,
    ``logit_bias``' keys; ``vocab`` None: not checked), or a bad ``salt``."""
    if not all(type(t) is int for t in ids) and not all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
        raise ValueError("prompt token ids must be integers")
    check_salt(salt)
    if len(ids) + (1 if params.max_tokens > 0 else 0) > max_model_len:  # (max_tokens 0: the prompt alone)
        raise PromptTooLongError(len(ids), max_model_len)
    if not ids:
        raise ValueError("the prompt must have at least one token")
    if vocab is None:
        return
    if min(ids) < 0 or max(ids) >= vocab:
        raise ValueError(f"prompt token ids must be in [0, {vocab})")
    if any(not 0 <= t < vocab for t in params.stop_token_ids):
        raise ValueError(f"stop_token_ids must be in [0, {vocab})")
    if params.logit_bias is not None and max(params.logit_bias) >= vocab:
        raise ValueError(f"logit_bias keys must be token ids in [0, {vocab})")


async def stream_outputs(queue: asyncio.Queue, stop: Callable[[], None]) -> AsyncIterator[RequestOutput]:
    """A request's ``RequestOutput``s from its queue until the finished one; an exception put in
    the queue ends the stream with it. Left early (closed, cancelled), it calls ``stop()`` (the
    request is aborted). ``engine.async_engine.AsyncEngine`` and ``engine.remote_engine.RemoteEngine`` both
    stream this way."""
    finished = False
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                finished = True
                raise item
            finished = item.finished
            yield item
            if finished:
                return
    finally:
        if not finished:
            stop()
