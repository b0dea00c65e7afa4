"""The request pipeline of chat and text completions, as plain functions.

    resolve model (404 / 403) → tokenize → max_tokens vs context length (400)
    → [chat: semantic cache lookup → hit: replay, JSON or SSE; a JSON miss identical to one in
       flight: wait for its answer and replay it (``gateway.flights``)]
    → quota reservation (429; may clamp max_tokens) → engine start (400 / 503)
    → JSON, or SSE through ``gateway.sse``
    → finally: abort the engine request if unfinished, settle the quota, record the usage row;
      store a cache miss's answer only when it completed normally.

The checks before the engine (model, prompt size, ``max_tokens``, sampling fields, fields the engine
cannot honour) are in ``gateway/request_checks.py``.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive

from engine.protocol import EngineClient
from gateway.accounting import RequestAccount
from gateway.aftercare import to_the_end
from gateway.cache_glue import cache_body, cache_lookup, cache_policy, cache_store
from gateway.deps import Caller
from gateway.disconnect import until_done_or_disconnect
from gateway.errors import (
    ApiError,
    insufficient_quota,
    invalid_request,
    unsupported,
)
from gateway.flights import Flights
from gateway.formats import (
    ChatFormat,
    CompletionFormat,
    TokenNames,
    encode_in_pieces,
    make_usage,
    natural_pieces,
    vllm_prompt_logprobs,
    with_prompt_logprobs,
)
from gateway.generation import (
    Generation,
    logprob_entries,
    row_finish_reason,
)
from gateway.request_checks import (
    LONG_PROMPT_CHARS,
    check_schema,
    refuse_far_too_long,
    refuse_unhonoured,
    refuse_unsupported,
    resolve_engine,
    resolve_max_tokens,
    sampling_params,
    scores_prompt,
    token_names_for,
    tokenize,
    vocab_size,
)
from gateway.schemas import MAX_PROMPTS, ChatCompletionRequest, CompletionRequest
from gateway.sse import SSEResponse, encode_event
from gateway.tool_answers import ToolCallFormat

log = logging.getLogger("pagegate.chat")

Format = ChatFormat | CompletionFormat
LOGPROBS_ON_A_THREAD = 8192  # logprob values in a whole answer past which it is built off the event loop
ECHO_ON_A_THREAD = 1 << 20  # echoed characters in a whole answer past which it is built off the event loop
Store = Callable[[dict], Awaitable[None]]
FOLLOW_ROUNDS = 3  # leaders of identical requests a follower waits for, one after the other (gateway.flights)


def chat_messages(body: ChatCompletionRequest) -> list[dict]:
    return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in body.messages]


# ------------------------------------------------------------------------------------- endpoints


async def create_chat_completion(body: ChatCompletionRequest, caller: Caller) -> Response:
    engine = resolve_engine(caller, body.model)
    plan = refuse_unhonoured(body)
    await check_schema(body, caller.principal.tenant_id)
    refuse_unsupported(body, engine)
    if plan is not None and plan.choice is not None:  # tools that may be called (gateway.tool_calls)
        await plan.compile(body, caller.principal.tenant_id)  # (the calls' schema, off the event loop)
        fmt: ChatFormat = ToolCallFormat(model=engine.model_id, include_usage=body.include_usage, choice=plan.choice,
                                         named=plan.tools[0].name if plan.choice == "named" else None)
    else:
        fmt = ChatFormat(model=engine.model_id, include_usage=body.include_usage,
                         token_names=token_names_for(body, engine), prompt_logprobs=_vllm_prompt(body, engine))
    messages = chat_messages(body) if plan is None else plan.messages(body)  # (earlier calls rendered as turns)
    account = RequestAccount(caller.state.services, caller.principal, request_id=caller.request_id,
                             model=engine.model_id, endpoint="chat.completions", started=caller.started)
    size = sum(len(m["content"]) for m in messages)
    refuse_far_too_long(engine, size, messages=len(messages))
    store: Store | None = None
    land: Callable[[dict | None], None] | None = None  # a leader's (gateway.flights)
    cache = caller.state.cache
    if cache is not None and (fmt.token_names is not None or fmt.prompt_logprobs is not None):
        # a stored answer has no logprobs to show
        account.cache = caller.response_headers["x-cache"] = "bypass"
        cache = None
    if cache is not None:  # before tokenizing: a hit needs neither the tokenizer nor the engine
        policy = cache_policy(caller.principal, caller.cache_control)
        request_body = cache_body(body)
        namespace = caller.principal.cache_namespace or str(caller.principal.tenant_id)
        lookup = await cache_lookup(cache, namespace, request_body, policy)
        account.cache = lookup.outcome
        caller.response_headers["x-cache"] = lookup.outcome
        if lookup.similarity is not None:
            caller.response_headers["x-cache-similarity"] = f"{lookup.similarity:.4f}"
        if lookup.outcome in ("hit", "semantic-hit") and lookup.response is not None:
            if caller.notice is not None:  # answered here: the engine must not wait for it
                caller.notice.close()
            prompt_tokens = None  # an exact hit's prompt is the stored one, token for token
            if lookup.outcome == "semantic-hit":  # a paraphrase: its own prompt is counted
                prompt_tokens = len(await tokenize(engine, engine.encode_chat, messages, size, messages=len(messages)))
            return await replay(lookup.response, fmt, account, stream=body.stream, prompt_tokens=prompt_tokens)
        if lookup.storable:  # a miss, or no-cache on a cacheable request; never no-store
            auth, principal = caller.state.services.auth, caller.principal
            store = cache_store(cache, namespace, request_body, policy,
                                still_valid=lambda: auth.still_valid(principal))
            flights = caller.state.flights
            if flights is not None and lookup.outcome == "miss" and lookup.key is not None and not body.stream:
                coalesced = await _coalesce(flights, (namespace, lookup.key), fmt, account, caller)
                if isinstance(coalesced, Response):
                    return coalesced
                land = coalesced  # this request leads
                store = _landing(store, land)
    try:
        prompt = await tokenize(engine, engine.encode_chat, messages, size, messages=len(messages))
        max_tokens = resolve_max_tokens(body.requested_max_tokens(), len(prompt), engine.max_model_len,
                                        min_tokens=body.min_tokens, field="max_completion_tokens"
                                        if body.max_completion_tokens is not None else "max_tokens")
        return await run_generation(engine, [prompt], body, max_tokens, fmt, account, caller, store=store,
                                    unstorable=None if land is None else partial(land, None))
    finally:
        if land is not None:  # (a JSON answer: done by now) no answer stored: the followers run themselves
            land(None)


async def _coalesce(flights: Flights, key: tuple, fmt: Format, account: RequestAccount,
                    caller: Caller) -> Response | Callable[[dict | None], None]:
    """Follow the leader of ``key`` (its answer replayed: a Response) or lead (``land`` returned).
    A follower whose leader landed nothing follows the next one, or leads (found by a review: each
    then ran on the engine, a burst whose first client left was N engine requests again); at most
    ``FOLLOW_ROUNDS`` leaders are waited for."""
    waited = False
    for _ in range(FOLLOW_ROUNDS):
        waiting = flights.follow(key)
        if waiting is None:
            break
        waited = True
        followed = await _follow(waiting, flights, fmt, account, caller)
        if followed is not None:
            return followed
    if waited:  # (once a follower, however many leaders it waited for: a re-check)
        flights.fell_back()
    return flights.lead(key)


def _landing(store: Store, land: Callable[[dict | None], None]) -> Store:
    """A leader's store (``gateway.flights``): its answer goes to the requests waiting for it first."""
    async def store_and_land(response: dict) -> None:
        land(response)
        await store(response)

    return store_and_land


async def _follow(waiting: asyncio.Future, flights: Flights, fmt: Format, account: RequestAccount,
                  caller: Caller) -> Response | None:
    """Wait for the leader of an identical request (``gateway.flights``) and replay its answer as a
    cache hit; None when it landed none (this request then runs on the engine itself)."""
    if caller.notice is not None:  # not on its way to the engine meanwhile (nor perhaps at all)
        caller.notice.close()
    answer: list[dict | None] = []

    async def wait() -> None:
        answer.append(await asyncio.shield(waiting))  # (a follower that leaves leaves the leader alone)

    if not await until_done_or_disconnect(wait(), caller.receive):
        await account.close_surely(status="aborted")
        return Response(status_code=499)  # nobody is listening any more
    if answer[0] is None:
        return None
    flights.served()
    account.cache = caller.response_headers["x-cache"] = "hit"
    caller.response_headers["x-cache-similarity"] = "1.0000"  # (an exact hit's: a re-check)
    caller.response_headers["x-cache-coalesced"] = "true"
    return await replay(answer[0], fmt, account, stream=False)


async def create_completion(body: CompletionRequest, caller: Caller) -> Response:
    engine = resolve_engine(caller, body.model)
    refuse_unhonoured(body)
    await check_schema(body, caller.principal.tenant_id)
    refuse_unsupported(body, engine)
    prompts_in = body.prompts()
    limit = min(MAX_PROMPTS, getattr(engine, "max_waiting", None) or MAX_PROMPTS)  # each prompt takes a place
    if len(prompts_in) > limit:
        why = "" if limit == MAX_PROMPTS else (" here: each prompt takes a running slot or a place in the engine's "
                                               f"waiting queue, of which a tenant may hold {limit}")
        noun = "prompt" if limit == 1 else "prompts"
        raise invalid_request(f"At most {limit} {noun} per request{why} (got {len(prompts_in)}).", param="prompt")
    if body.suffix:
        raise unsupported("suffix")
    if body.max_tokens == 0 and not body.echo:  # (0 scores the prompt: only with echo, as OpenAI's legacy API)
        raise invalid_request("max_tokens must be at least 1 (0 only with echo, to score the prompt).",
                              param="max_tokens")
    if body.best_of is not None and body.best_of < 1:  # a wrong value, not a feature missing (QA)
        raise invalid_request(f"best_of must be at least 1 (got {body.best_of}).", param="best_of")
    if body.best_of not in (None, 1):
        raise unsupported("best_of", "best_of must be 1 (use n for several completions).")
    prompts = await completion_prompts(engine, prompts_in, body.batched)
    max_tokens = body.requested_max_tokens()
    for i, prompt in enumerate(prompts):
        try:
            resolve_max_tokens(max_tokens, len(prompt), engine.max_model_len, min_tokens=body.min_tokens,
                               what="prompt", defaulted=body.max_tokens is None)
        except ApiError as err:
            if err.param != "min_tokens":
                err.param = _prompt_param(i, body.batched)
            raise
    texts = [_echo_text(engine, p, held_back=max_tokens > 0) for p in prompts_in] if body.echo else []
    echo = tuple(t for t in texts for _ in range(body.n))  # per choice
    fmt = CompletionFormat(model=engine.model_id, include_usage=body.include_usage, echo=echo,
                           token_names=token_names_for(body, engine), scored=scores_prompt(body),
                           echo_top=body.logprobs or 0,
                           prompt_logprobs=_vllm_prompt(body, engine))
    account = RequestAccount(caller.state.services, caller.principal, request_id=caller.request_id,
                             model=engine.model_id, endpoint="completions", started=caller.started)
    return await run_generation(engine, prompts, body, max_tokens, fmt, account, caller)


def _echo_text(engine: EngineClient, prompt: str | list[int], *, held_back: bool) -> str:
    """What ``echo`` shows of a prompt: its text, or the text of its token ids (their bytes as
    UTF-8, a broken character as U+FFFD, as the model's own output is decoded). ``held_back``: the
    answer goes on after it, so a character its last tokens leave unfinished is left to the
    answer, which shows it whole once a token completes it (found by QA: shown twice, as U+FFFD
    at the end of the echo and whole in the answer)."""
    if isinstance(prompt, str):
        return prompt
    try:
        raw = b"".join(engine.token_bytes(list(prompt)))
        if held_back:
            return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(raw, final=False)
        return raw.decode("utf-8", errors="replace")
    except ValueError as err:  # a model without a tokenizer: its tokens have no text
        raise invalid_request("echo needs a text prompt here: this model's tokens have no text.",
                              param="echo") from err


def _vllm_prompt(body: ChatCompletionRequest | CompletionRequest, engine: EngineClient
                 ) -> tuple[int, TokenNames] | None:
    """vLLM's ``prompt_logprobs`` as the formats take it: (k, the engine's token names), or None."""
    return None if body.prompt_logprobs is None else (body.prompt_logprobs, TokenNames.for_engine(engine))


def _prompt_param(index: int, batched: bool) -> str:
    return f"prompt[{index}]" if batched else "prompt"


async def completion_prompts(engine: EngineClient, prompts_in: list[str] | list[list[int]],
                             batched: bool) -> list[list[int]]:
    """Each prompt's token ids: text tokenized (on a worker thread when the batch's text is long),
    ids checked against the vocabulary; 400s name the prompt (``prompt[i]`` in a batch)."""
    if prompts_in and isinstance(prompts_in[0], str):
        texts: list[str] = prompts_in  # type: ignore[assignment]
        for i, text in enumerate(texts):
            try:
                refuse_far_too_long(engine, len(text), what="prompt")
            except ApiError as err:
                err.param = _prompt_param(i, batched)
                raise
        if sum(len(t) for t in texts) > LONG_PROMPT_CHARS:
            out = await asyncio.to_thread(lambda: [list(engine.encode(t)) for t in texts])
        else:
            out = [list(engine.encode(t)) for t in texts]
    else:
        vocab = vocab_size(engine)
        out = [list(ids) for ids in prompts_in]  # type: ignore[arg-type]
        for i, ids in enumerate(out):
            if ids and (min(ids) < 0 or (vocab is not None and max(ids) >= vocab)):
                raise invalid_request("The prompt holds token ids outside the model's vocabulary.",
                                      param=_prompt_param(i, batched))
    for i, ids in enumerate(out):
        if not ids:
            raise invalid_request("The prompt must not be empty.", param=_prompt_param(i, batched))
    return out


# ----------------------------------------------------------------------------------- generation


async def run_generation(engine: EngineClient, prompts: list[list[int]],
                         body: ChatCompletionRequest | CompletionRequest, max_tokens: int, fmt: Format,
                         account: RequestAccount, caller: Caller, *, store: Store | None = None,
                         unstorable: Callable[[], None] | None = None) -> Response:
    """``prompts``: one engine request each (a text completion's batch), ``body.n`` choices each.
    ``unstorable``: called at once when the answer will not be stored (a coalescing leader's
    followers then stop waiting for it: ``gateway.flights``)."""
    n = body.n * len(prompts)  # the answer's choices
    # the fewest tokens a choice may be clamped to: its ``min_tokens`` (a clamp below them was a
    # quiet short answer, found by QA), else one
    floor = max(1, min(body.min_tokens, max_tokens))
    reserved = await account.reserve(prompt_tokens=sum(len(p) for p in prompts), max_tokens=max_tokens * n,
                                     min_tokens=floor * n)
    caller.response_headers.update(account.headers)
    gen: Generation | None = None
    try:
        per_choice = min(max_tokens, reserved // n)
        if per_choice < 1 and max_tokens > 0:  # (max_tokens 0: a prompt scored, nothing to clamp)
            raise insufficient_quota("Your quota leaves no room for a completion.", retry_after_s=60)
        if per_choice < max_tokens:
            store = None  # clamped by the quota: not the answer this request asked for
            if unstorable is not None:
                unstorable()
        params = sampling_params(body, per_choice)
        gen = Generation.open(engine, prompts, params, request_id=caller.request_id,
                              tenant=str(caller.principal.tenant_id), started=caller.started, notice=caller.notice)
        gen.keep_logprobs = not body.stream or store is not None
        # A stream starts only once the engine took the request (its refusals stay HTTP errors);
        # a client that leaves while the request is still queued aborts it there and then. (A
        # JSON answer waits for the engine under the same watch, in whole_response.)
        if body.stream and not await until_done_or_disconnect(gen.start(), caller.receive):
            await _settle(gen, account, "aborted")
            return Response(status_code=499)
    except BaseException:
        await to_the_end(_close(gen, account, {"status": "error"}))
        raise
    if body.stream:
        return SSEResponse(stream_events(gen, fmt, account, n, store))
    return await whole_response(gen, fmt, account, caller.receive, store)


def _usage(gen: Generation):  # noqa: ANN202 - schemas.Usage
    return make_usage(gen.prompt_tokens, gen.completion_tokens, gen.cached_tokens)


def _whole(gen: Generation, fmt: Format) -> BaseModel:
    n = len(gen.choices)
    logprobs = gen.logprobs() if fmt.token_names is not None else None
    if logprobs is not None and getattr(fmt, "scored", False):  # echo with logprobs: the prompt's tokens first
        per_prompt = n // len(gen.prompts)
        logprobs = [(gen.prompt_entries(i // per_prompt, fmt.echo_top) or []) + entries
                    for i, entries in enumerate(logprobs)]
    answer = fmt.response([gen.text(i) for i in range(n)], [c.finish_reason for c in gen.choices], _usage(gen),
                          logprobs)
    if fmt.prompt_logprobs is not None:  # vLLM's field (never streamed)
        k, names = fmt.prompt_logprobs
        answer = with_prompt_logprobs(answer, [vllm_prompt_logprobs(ids, gen.prompt_logprobs.get(p), names, k)
                                               for p, ids in enumerate(gen.prompts)])
    return answer


def _stored(gen: Generation, fmt: Format, shown: BaseModel | None = None) -> BaseModel:
    """What the cache keeps of an answer: as shown (``shown``, when it is built already), or for
    tool calls (``gateway.tool_answers``) each choice's text as decoded, with the engine's finish
    reason, from which a replay in the request's format shows the calls again (a stored answer
    replays as text)."""
    if not isinstance(fmt, ToolCallFormat):
        return shown if shown is not None else _whole(gen, fmt)
    n = len(gen.choices)
    return ChatFormat(model=fmt.model).response([gen.text(i) for i in range(n)],
                                                [c.finish_reason for c in gen.choices], _usage(gen))


async def _settle(gen: Generation, account: RequestAccount, status: str, *, delivered: bool = True) -> None:
    """Close the engine request and the account, to their end through cancellations
    (``to_the_end``); at once when nothing in it waits (the engine's stream ended,
    ``account.closes_now``): a task is only cancelled where it waits. ``delivered``: the client got what was generated (a stream); a JSON
    answer that ends in an error gave it nothing, and costs nothing."""
    if gen.exhausted and account.closes_now:
        account.close_now(**_outcome(gen, status, delivered))
        return
    await to_the_end(_close(gen, account, _outcome(gen, status, delivered)))


async def _close(gen: Generation | None, account: RequestAccount, outcome: dict) -> None:
    if gen is not None:
        await gen.aclose()  # aborts the engine request if it is still running
    await account.close(**outcome)


def _outcome(gen: Generation, status: str, delivered: bool = True) -> dict:
    if (status == "error" and not (gen.taken and delivered)) or (status == "aborted" and not gen.computed):
        # refused by the engine (overloaded, stopped, bad ids), a JSON answer that failed (the
        # engine stopped, the server shutting down; an SDK retries the 503), or a client that left
        # while its request still waited in the engine's queue (found by QA: billed its prompt,
        # which the engine never computed): nothing to charge
        return dict(status=status, finish_reason=None, prompt_tokens=0, cached_prompt_tokens=0,
                    completion_tokens=0, ttft_ms=None)
    return dict(status=status, finish_reason=gen.finish_reason if gen.finished else None,
                prompt_tokens=gen.prompt_tokens, cached_prompt_tokens=gen.cached_tokens,
                completion_tokens=gen.completion_tokens, ttft_ms=gen.ttft_ms)


async def _store(store: Store | None, response: BaseModel) -> None:
    if store is None:
        return
    try:
        await store(response.model_dump(mode="json"))
    except Exception:  # the cache is best effort: the client already has its answer
        log.exception("cache store failed")


async def stream_events(gen: Generation, fmt: Format, account: RequestAccount, n: int,
                        store: Store | None) -> AsyncIterator[BaseModel | bytes]:
    status = "aborted"  # until the engine says finished: a client that leaves aborts
    try:
        for chunk in fmt.opening(n):
            yield chunk
        echoing = set(range(n)) if getattr(fmt, "scored", False) else set()  # echo chunks still to send
        async for deltas in gen.deltas():
            for d in deltas:
                if d.index in echoing:  # its prompt's logprobs came with its first output
                    echoing.discard(d.index)
                    entries = gen.prompt_entries(d.index // (n // len(gen.prompts)), fmt.echo_top)
                    yield await _echo_chunk(fmt, d.index, entries or [])
                if d.logprobs and fmt.token_names is not None:  # (a closing EOS's delta has none: [])
                    yield fmt.text_chunk(d.index, d.text, logprob_entries(d))  # its tokens, text or not yet
                elif d.text:
                    chunk = fmt.text_chunk(d.index, d.text)
                    if chunk is not None:  # (a tool call's text shows nothing until a name or arguments come)
                        yield chunk
                if d.finish_reason is not None:
                    yield fmt.finish_chunk(d.index, d.finish_reason)
        status = "ok"
        if fmt.include_usage:
            yield fmt.usage_chunk(_usage(gen))
        if store is not None:  # (the whole answer is built only to be stored)
            await _store(store, _stored(gen, fmt))
    except ApiError:
        status = "error"
        raise
    finally:
        await _settle(gen, account, status)


async def _echo_chunk(fmt: CompletionFormat, index: int, entries: list[tuple]) -> BaseModel | bytes:
    """A scored stream's echo chunk; a long prompt's (thousands of entries with their alternatives:
    ~60 ms per 1,000 tokens with 20) is built and encoded on a worker thread, as a whole answer's is."""
    if sum(1 + len(e[2] or ()) for e in entries) <= LOGPROBS_ON_A_THREAD:
        return fmt.echo_chunk(index, entries)
    return await asyncio.to_thread(lambda: encode_event(fmt.echo_chunk(index, entries)))


async def whole_response(gen: Generation, fmt: Format, account: RequestAccount, receive: Receive,
                         store: Store | None) -> Response:
    """Start, generate to the end and answer in one JSON body; the client leaving at any point
    (its request still queued included) aborts the engine request."""
    status = "error"
    try:
        if not await until_done_or_disconnect(_start_and_run(gen), receive):
            status = "aborted"
            return Response(status_code=499)  # nobody is listening any more
        status = "ok"
        if store is None and _heavy(gen, fmt):
            # thousands of logprobs (~60 ms per 1,000 tokens with 20 alternatives), or megabytes of
            # echoed prompts: built and encoded on a worker thread, which gives the event loop the
            # GIL back every switch interval, rather than one stall of every other request
            body = await asyncio.to_thread(lambda: encode_in_pieces(_whole(gen, fmt)))
            return Response(body, media_type="application/json")
        response = _whole(gen, fmt)
        await _store(store, _stored(gen, fmt, response))
        return Response(response.model_dump_json(), media_type="application/json")
    finally:
        await _settle(gen, account, status, delivered=False)


def _heavy(gen: Generation, fmt: Format) -> bool:
    """An answer too big to build on the event loop: many logprobs, or a batch's echoed prompts."""
    if fmt.token_names is not None and gen.logprob_values() > LOGPROBS_ON_A_THREAD:
        return True
    return isinstance(fmt, CompletionFormat) and sum(map(len, fmt.echo)) > ECHO_ON_A_THREAD


async def _start_and_run(gen: Generation) -> None:
    await gen.start()
    await gen.run_to_end()


# ---------------------------------------------------------------------------------- cache replay


REPLAY_PIECES_PER_TURN = 32  # ~0.3 ms of encoding between two turns of the event loop


async def replay(stored: dict, fmt: Format, account: RequestAccount, *, stream: bool,
                 prompt_tokens: int | None = None) -> Response:
    """Serve a cached answer in the request's own format; nothing reaches the engine.
    ``prompt_tokens``: this request's own (a semantic hit's prompt differs from the stored one's)."""
    usage = stored.get("usage") or {}
    if prompt_tokens is None:
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
    completion_tokens = int(usage.get("completion_tokens") or 0)
    choices = sorted(stored.get("choices") or [], key=lambda c: c.get("index", 0))
    texts = [((c.get("message") or {}).get("content") or c.get("text") or "") for c in choices]
    reasons = [c.get("finish_reason") or "stop" for c in choices]
    whole = fmt.response(texts, reasons, make_usage(prompt_tokens, completion_tokens, 0))
    ttft_ms = (time.perf_counter() - account.started) * 1000  # the whole answer is ready: its first token too

    async def close(sent_chars: int | None = None) -> None:
        """``sent_chars``: a stream cut before its last choice finished (the client left) is
        recorded ``aborted`` with the share of the answer's tokens its text had reached (found by
        QA: a replay cut short was recorded ``ok`` with the whole answer's tokens and savings)."""
        if sent_chars is None:
            await account.close_surely(status="ok", finish_reason=row_finish_reason(reasons),
                                       prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                       ttft_ms=ttft_ms, cache_hit=True)
            return
        total = sum(len(t) for t in texts)
        sent = -(-completion_tokens * sent_chars // total) if total else 0  # (rounded up)
        await account.close_surely(status="aborted", prompt_tokens=prompt_tokens, completion_tokens=sent,
                                   ttft_ms=ttft_ms, cache_hit=True)

    if not stream:
        try:
            return Response(whole.model_dump_json(), media_type="application/json")
        finally:
            await close()

    async def events() -> AsyncIterator[BaseModel]:
        sent_chars: int | None = 0  # None once every choice has finished
        try:
            for chunk in fmt.opening(len(texts)):
                yield chunk
            pieces = 0
            for i, text in enumerate(texts):
                for piece in natural_pieces(text):
                    chunk = fmt.text_chunk(i, piece)
                    if chunk is not None:  # (a tool call's text shows nothing until a name or arguments come)
                        yield chunk
                    sent_chars += len(piece)
                    pieces += 1
                    if pieces % REPLAY_PIECES_PER_TURN == 0:
                        # a send that the socket takes at once never suspends: without a turn the
                        # loop would serve nothing else, nor hear the client leave, until the
                        # whole answer is written (found by QA: a 15 MB replay, 1.2 s)
                        await asyncio.sleep(0)
                yield fmt.finish_chunk(i, reasons[i])
            sent_chars = None
            if fmt.include_usage:
                yield fmt.usage_chunk(whole.usage)  # type: ignore[arg-type]
        finally:
            await close(sent_chars)

    return SSEResponse(events())
