"""One engine request as the gateway sees it: started (so that engine refusals become HTTP errors
before any byte is sent), folded choice by choice, and closed (which aborts it in the engine).

    gen = Generation.open(engine, prompt_ids, params, request_id=..., tenant="42")
    await gen.start()                      # PromptTooLong → 400, overloaded → 503
    async for deltas in gen.deltas(): ...  # per engine output; gen.choices accumulate
    await gen.aclose()                     # always (finally): aborts an unfinished request
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engine.outputs import (
    CompletionDelta,
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    PromptTooLongError,
    RequestOutput,
)
from engine.protocol import EngineClient
from engine.sampling_params import SamplingParams
from gateway.errors import ApiError, invalid_request, overloaded


def context_length_exceeded(prompt_tokens: int, max_model_len: int, max_tokens: int | None = None, *,
                            what: str = "messages") -> ApiError:
    """``what``: "messages" (chat) or "prompt" (text completions), also the error's ``param``."""
    if max_tokens is None:
        message = (f"This model's maximum context length is {max_model_len} tokens. However, your "
                   f"{what} resulted in {prompt_tokens} tokens. Please reduce the length of the {what}.")
    else:
        message = (f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                   f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {what}, {max_tokens} in "
                   f"the completion). Please reduce the length of the {what} or completion.")
    return ApiError(400, message, "invalid_request_error", "context_length_exceeded", what)


def far_too_long(chars: int, max_model_len: int, *, what: str = "messages") -> ApiError:
    """A prompt of more characters than ``max_model_len`` tokens can ever hold, refused before the
    tokenizer spends seconds on it."""
    return ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, your {what} "
                         f"hold {chars:,} characters, more than that many tokens can ever cover. Please reduce "
                         f"the length of the {what}.", "invalid_request_error", "context_length_exceeded", what)


def engine_error(err: EngineError) -> ApiError:
    if isinstance(err, PromptTooLongError):
        return context_length_exceeded(err.prompt_tokens, err.max_model_len)
    if isinstance(err, EngineOverloadedError):
        return overloaded()
    if isinstance(err, EngineDeadError):
        return ApiError(503, "The engine is not running.", "server_error", "engine_unavailable")
    return ApiError(500, "The engine failed to process the request.", "server_error", "engine_error")


@dataclass(slots=True)
class ChoiceState:
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    num_tokens: int = 0
    logprobs: list[tuple] = field(default_factory=list)  # with logprobs asked: (token id, logprob, top) each


def logprob_entries(delta: CompletionDelta) -> list[tuple] | None:
    """The delta's tokens with their logprobs, as ``gateway.formats`` shows them (None: not asked)."""
    if delta.logprobs is None:
        return None
    # (a closing EOS has no entry: the shorter list ends the pairs)
    return [(t, lp, top) for t, (lp, top) in zip(delta.token_ids, delta.logprobs, strict=False)]


class Generation:
    def __init__(self, agen: AsyncIterator[RequestOutput], *, n: int, prompt_tokens: int,
                 started: float) -> None:
        self._agen = agen
        self._pending: RequestOutput | None = None
        self.choices = [ChoiceState() for _ in range(n)]
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = 0
        self.started = started  # perf_counter() when the HTTP request arrived
        self.first_token_at: float | None = None
        self.finished = False
        self.exhausted = False  # the engine's stream has ended: closing it has nothing left to do
        self.taken = False  # the engine has sent an output: it took the request (its prompt is computed)
        self.keep_logprobs = True  # False: a stream shows each delta's as it goes, none are kept

    @classmethod
    def open(cls, engine: EngineClient, prompt: list[int], params: SamplingParams, *, request_id: str,
             tenant: str, started: float, notice: object | None = None) -> Generation:
        """``notice``: the request's ``announce()`` (``Caller.notice``), handed to the engine."""
        extra = {} if notice is None else {"notice": notice}
        try:
            agen = engine.generate(prompt, params, request_id=request_id, salt=tenant, priority_class=tenant, **extra)
        except EngineError as err:
            raise engine_error(err) from err
        return cls(agen, n=params.n, prompt_tokens=len(prompt), started=started)

    async def start(self) -> None:
        """Wait for the first output (after prefill); engine refusals surface here."""
        try:
            self._pending = await anext(self._agen)
        except StopAsyncIteration:
            self.finished = self.exhausted = True
        except EngineError as err:
            raise engine_error(err) from err
        except ValueError as err:  # the engine refused the request's values (e.g. token ids)
            raise invalid_request(str(err), param="prompt") from err

    async def deltas(self) -> AsyncIterator[list[CompletionDelta]]:
        """Each engine output's deltas, after folding them into ``choices``."""
        if self._pending is not None:
            out, self._pending = self._pending, None
            yield self._fold(out)
        try:
            if self.finished:  # the stream ends right after its finished output: let it
                async for _ in self._agen:
                    pass
            else:
                async for out in self._agen:
                    yield self._fold(out)
        except EngineError as err:
            raise engine_error(err) from err
        self.exhausted = True

    async def run_to_end(self) -> None:
        async for _ in self.deltas():
            pass

    def _fold(self, out: RequestOutput) -> list[CompletionDelta]:
        self.taken = True
        self.prompt_tokens = out.prompt_tokens
        self.cached_tokens = out.cached_prompt_tokens
        for d in out.deltas:
            choice = self.choices[d.index]
            if d.text:
                choice.text.append(d.text)
            if d.logprobs is not None and self.keep_logprobs:
                choice.logprobs += logprob_entries(d)
            choice.num_tokens = max(choice.num_tokens, d.num_tokens)
            if d.finish_reason is not None:
                choice.finish_reason = d.finish_reason
            if self.first_token_at is None and d.token_ids:
                self.first_token_at = time.perf_counter()
        if out.finished:
            self.finished = True
            if any(c.finish_reason == "abort" for c in self.choices):
                raise ApiError(503, "The request was aborted by the engine.", "server_error", "engine_abort")
        return out.deltas

    @property
    def completion_tokens(self) -> int:
        return sum(c.num_tokens for c in self.choices)

    @property
    def finish_reason(self) -> str | None:
        reasons = [c.finish_reason for c in self.choices]
        return "length" if "length" in reasons else reasons[0]

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_at is None else (self.first_token_at - self.started) * 1000

    def text(self, index: int) -> str:
        return "".join(self.choices[index].text)

    def logprob_values(self) -> int:
        """How many logprobs the kept entries hold (each token's and its alternatives')."""
        return sum(1 + len(e[2]) for c in self.choices for e in c.logprobs)

    def logprobs(self) -> list[list[tuple]]:
        """Each choice's tokens with their logprobs (empty lists when none were asked)."""
        return [c.logprobs for c in self.choices]

    async def aclose(self) -> None:
        aclose = getattr(self._agen, "aclose", None)
        if aclose is not None and not self.exhausted:
            await aclose()
