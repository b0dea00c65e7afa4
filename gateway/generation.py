"""One engine request (or a text completion's batch of them, as one) as the gateway sees it:
started (so that engine refusals become HTTP errors before any byte is sent), folded choice by
choice, and closed (which aborts it in the engine).

    gen = Generation.open(engine, [prompt_ids], params, request_id=..., tenant="42")
    await gen.start()                      # PromptTooLong → 400, overloaded → 503
    async for deltas in gen.deltas(): ...  # per engine output; gen.choices accumulate
    await gen.aclose()                     # always (finally): aborts an unfinished request
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engine.outputs import (
    CompletionDelta,
    EngineClassFullError,
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    EngineStoppingError,
    PromptTooLongError,
    RequestOutput,
)
from engine.protocol import EngineClient
from engine.sampling_params import SamplingParams
from gateway.errors import ApiError, invalid_request, overloaded, rate_limited, shutting_down


def context_length_exceeded(prompt_tokens: int, max_model_len: int, max_tokens: int | None = None, *,
                            what: str = "messages") -> ApiError:
    """``what``: "messages" (chat) or "prompt" (text completions), also the error's ``param``."""
    if max_tokens is None:  # the prompt alone leaves no room for one completion token
        message = (f"This model's maximum context length is {max_model_len} tokens. However, your "
                   f"{what} resulted in {prompt_tokens} tokens, which leaves no room for a completion. "
                   f"Please reduce the length of the {what}.")
    else:
        message = (f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                   f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {what}, {max_tokens} in "
                   f"the completion). Please reduce the length of the {what} or completion.")
    return ApiError(400, message, "invalid_request_error", "context_length_exceeded", what)


def far_too_long(chars: int, max_model_len: int, *, what: str = "messages") -> ApiError:
    """A prompt of more characters than ``max_model_len`` tokens can ever hold, refused before the
    tokenizer spends seconds on it."""
    return ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, your {what} "
                         f"{'holds' if what == 'prompt' else 'hold'} {chars:,} characters, more than that many tokens can ever cover. Please reduce "
                         f"the length of the {what}.", "invalid_request_error", "context_length_exceeded", what)


def too_many_turns(messages: int, per_message: int, at_least: int, max_model_len: int) -> ApiError:
    """A chat whose messages alone (the template's tokens for each) can never fit the context."""
    return ApiError(400, f"This model's maximum context length is {max_model_len} tokens. However, your "
                         f"{messages:,} messages resulted in at least {at_least:,} tokens (the chat format adds "
                         f"{per_message} to each message, whatever it holds). Please reduce the number or the "
                         f"length of the messages.", "invalid_request_error", "context_length_exceeded", "messages")


def engine_error(err: EngineError) -> ApiError:
    if isinstance(err, PromptTooLongError):
        return context_length_exceeded(err.prompt_tokens, err.max_model_len)
    if isinstance(err, EngineClassFullError):  # this tenant's share of the queue, not the server's
        return rate_limited("Too many of your requests are waiting for the engine already; retry when some "
                            "have finished.", retry_after_s=1.0)
    if isinstance(err, EngineOverloadedError):
        return overloaded()
    if isinstance(err, EngineDeadError):
        return ApiError(503, "The engine is not running.", "server_error", "engine_unavailable")
    if isinstance(err, EngineStoppingError):
        return shutting_down()
    return ApiError(500, "The engine failed to process the request.", "server_error", "engine_error")


def row_finish_reason(reasons: list[str | None]) -> str | None:
    """The one finish reason a usage row keeps for ``n`` choices: ``length`` when any choice was cut
    short (the answer is not whole), else the first choice's."""
    return "length" if "length" in reasons else (reasons[0] if reasons else None)


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


async def merged_outputs(agens: list[AsyncIterator[RequestOutput]], n: int, request_id: str
                         ) -> AsyncIterator[RequestOutput]:
    """Several engine requests of ``n`` choices each as one: choice ``j`` of request ``p`` becomes
    choice ``p * n + j``, prompt and cached tokens are the sums over the prompts the engine has
    answered (one not yet computed counts nothing: a client that leaves then is not billed for it,
    as a single request that leaves before its first output is not; found by QA: a batch of eight
    long prompts left at its first event was billed all 13,672 prompt tokens), finished when all are. Each output
    carries whatever has arrived, from the first request's first on (waiting for every prefill
    would hold the answer back while requests beyond the engine's running batch wait for others to
    finish, and leave their tokens unbilled if the client left meanwhile). A refusal at submission
    (overloaded, bad ids) still comes first: every request is submitted in the iteration after this
    starts, before any output can arrive. An error of one ends the whole; leaving early (closed,
    cancelled) stops every request still running."""
    count = len(agens)
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(p: int, agen: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in agen:
                queue.put_nowait((p, out))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait((p, exc))
        else:
            queue.put_nowait((p, None))
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                await aclose()  # (cancelled: the engine's stream stops its request as it unwinds)

    tasks = [asyncio.create_task(pump(p, agen), name=f"{request_id}.{p}") for p, agen in enumerate(agens)]
    prompt_tokens, cached = [0] * count, [0] * count
    scored: dict[int, list] = {}  # prompt logprobs come in (``prompt_logprobs``), by prompt
    done = [False] * count  # finished (or its stream ended)
    opened = False  # an output went out
    try:
        while not all(done):
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            deltas: list[CompletionDelta] = []
            error: BaseException | None = None
            for p, item in items:
                if isinstance(item, BaseException):
                    error = error or item
                    continue
                if item is None:
                    done[p] = True
                    continue
                prompt_tokens[p], cached[p] = item.prompt_tokens, item.cached_prompt_tokens
                if item.prompt_logprobs is not None:
                    scored[p] = item.prompt_logprobs
                for d in item.deltas:
                    d.index += p * n
                deltas.extend(item.deltas)
                done[p] = done[p] or item.finished
            if error is not None:
                if deltas and opened:  # what came with it is counted (billed) before it ends the whole;
                    yield RequestOutput(request_id, deltas, sum(prompt_tokens), sum(cached), False)
                raise error  # (before the first output: a refusal, which no output may precede)
            if deltas or all(done):
                opened = True
                # (the prompt logprobs as {prompt: entries}: ``Generation`` reads either shape)
                yield RequestOutput(request_id, deltas, sum(prompt_tokens), sum(cached), all(done),
                                   prompt_logprobs=scored or None)
                scored = {}
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Generation:
    def __init__(self, agen: AsyncIterator[RequestOutput], *, n: int, prompt_tokens: int,
                 started: float, prompts: list[list[int]] | None = None) -> None:
        self._agen = agen
        self.prompts = prompts or []
        self.prompt_logprobs: dict[int, list] = {}  # by prompt: the engine's entries (``prompt_logprobs``)
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
    def open(cls, engine: EngineClient, prompts: list[list[int]], params: SamplingParams, *, request_id: str,
             tenant: str, started: float, notice: object | None = None) -> Generation:
        """One engine request per prompt, ``params.n`` choices each; several are merged into one
        stream (``merged_outputs``: choice ``j`` of prompt ``p`` is choice ``p * n + j``).
        ``notice``: the request's ``announce()`` (``Caller.notice``), handed to the engine with the
        first prompt."""
        agens: list[AsyncIterator[RequestOutput]] = []
        try:
            for p, prompt in enumerate(prompts):
                extra = {} if notice is None or p else {"notice": notice}
                rid = request_id if len(prompts) == 1 else f"{request_id}.{p}"
                agens.append(engine.generate(prompt, params, request_id=rid, salt=tenant, priority_class=tenant,
                                             **extra))
        except EngineError as err:
            raise engine_error(err) from err
        agen = agens[0] if len(agens) == 1 else merged_outputs(agens, params.n, request_id)
        return cls(agen, n=params.n * len(prompts), prompt_tokens=sum(len(p) for p in prompts), started=started,
                   prompts=prompts)

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
        except ValueError as err:  # a batch's later prompt refused by the engine's step thread
            raise invalid_request(str(err), param="prompt") from err
        self.exhausted = True

    async def run_to_end(self) -> None:
        async for _ in self.deltas():
            pass

    def _fold(self, out: RequestOutput) -> list[CompletionDelta]:
        self.taken = True
        self.prompt_tokens = out.prompt_tokens
        self.cached_tokens = out.cached_prompt_tokens
        if out.prompt_logprobs is not None:  # one engine request's list, or a batch's {prompt: list}
            got = out.prompt_logprobs
            self.prompt_logprobs.update(got if isinstance(got, dict) else {0: got})
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
    def computed(self) -> bool:
        """Whether the engine has answered at all (its first output comes after the prompt's
        prefill): a request stopped before that cost the engine nothing it could bill."""
        return self.taken or self._pending is not None

    @property
    def completion_tokens(self) -> int:
        return sum(c.num_tokens for c in self.choices)

    @property
    def finish_reason(self) -> str | None:
        return row_finish_reason([c.finish_reason for c in self.choices])

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_at is None else (self.first_token_at - self.started) * 1000

    def text(self, index: int) -> str:
        return "".join(self.choices[index].text)

    def logprob_values(self) -> int:
        """How many logprobs the kept entries hold (each token's and its alternatives')."""
        n = len(self.choices) // max(1, len(self.prompts))  # choices per prompt (each shows its prompt's)
        scored = sum(1 + len(e[1]) for got in self.prompt_logprobs.values() for e in got if e is not None)
        return sum(1 + len(e[2]) for c in self.choices for e in c.logprobs) + n * scored

    def logprobs(self) -> list[list[tuple]]:
        """Each choice's tokens with their logprobs (empty lists when none were asked)."""
        return [c.logprobs for c in self.choices]

    def prompt_entries(self, prompt: int, top: int) -> list[tuple] | None:
        """The prompt's tokens with their logprobs and ``top`` alternatives at most, as
        ``logprob_entries`` (the first token's logprob and alternatives None: nothing comes before
        it); None until the engine sent them. (The engine may have made more alternatives, for
        vLLM's ``prompt_logprobs``: found by a re-check, echo with ``logprobs: 1`` showed 5.)"""
        got = self.prompt_logprobs.get(prompt)
        if got is None:
            return None
        return [(t, None, None) if e is None else (t, e[0], e[1][:top])
                for t, e in zip(self.prompts[prompt], got, strict=True)]

    async def aclose(self) -> None:
        aclose = getattr(self._agen, "aclose", None)
        if aclose is not None and not self.exhausted:
            await aclose()
