"""The asyncio front of the engine (fills ``engine.protocol.EngineClient``).

    asyncio side                         engine thread (daemon)
    generate() ── add cmd ──► cmds ──►   apply adds/aborts; step(); step(); ...
    per-request asyncio.Queue ◄── loop.call_soon_threadsafe(put) ── RequestOutput deltas

The step loop never runs on the event loop; it sleeps on a condition while idle and is woken
by new commands. Woken from idle, it waits for the rest of the burst (``engine.arrivals``): for
the requests announced with ``announce()`` (the gateway announces each request once its key is
known, before its rate limit and quota), or, for unannounced ones, while they keep arriving
within ``admission_gap_ms`` of each other; at most ``admission_max_wait_ms`` in all. So a wave
that reaches it spread over a few milliseconds (50 clients through the gateway) starts as one
step. Closing or cancelling a ``generate`` stream aborts its request (blocks freed before the
next step). If the loop dies, every pending stream gets ``EngineDeadError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engine.arrivals import ArrivalNotice, BurstGate
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import (
    EngineClassFullError,
    EngineDeadError,
    EngineOverloadedError,
    EngineStats,
    RequestOutput,
    check_prompt,
    stream_outputs,
)
from engine.sampling_params import SamplingParams
from engine.tokenizer import ChatRenderer

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    salt: str | None
    priority_class: str | None


@dataclass(slots=True)
class _Abort:
    request_id: str


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: RequestOutput | BaseException) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
            pass


def _deliver(batch: list[tuple[_Stream, RequestOutput]]) -> None:
    """Hand a step's outputs to their consumers: one cross-thread wake-up (a system call on the
    loop's wake-up descriptor) per event loop for the whole step instead of one per output."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
    for stream, out in batch:
        by_loop.setdefault(stream.loop, []).append((stream.queue, out))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # the consumers' loop is closed: nobody is listening any more
            pass


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for queue, out in items:
        queue.put_nowait(out)


class AsyncEngine:
    def __init__(self, config: EngineConfig, *, engine: LLMEngine | None = None,
                 model_id: str | None = None) -> None:
        self.config = config
        self.engine = engine
        self.model_id = model_id or config.served_model_name or _served_name(config.model)
        self._cv = threading.Condition()
        self._cmds: list[_Add | _Abort] = []
        self._adds_sent = 0  # the _Add commands among them
        # (KV blocks, requests) that requests taken into free running slots claimed: since the
        # commands were last taken, and taken into the step in progress (not yet in self._stats)
        self._claims = (0, 0)
        self._step_claims = (0, 0)
        self._burst = BurstGate(self._cv, gap_ms=config.admission_gap_ms, notice_gap_ms=config.admission_notice_gap_ms,
                                max_wait_ms=config.admission_max_wait_ms)
        self._streams: dict[str, _Stream] = {}
        # ids whose consumer left before the step thread applied their abort: still in the engine,
        # so not free for a new request yet (its outputs would reach the new stream)
        self._retiring: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dead: BaseException | None = None
        self._stats: EngineStats | None = None
        # requests waiting per scheduling class: in the engine as of its last step (the step thread
        # replaces the dict), and sent since the step thread last took its commands (under _cv)
        self._waiting_by_class: dict[str | None, int] = {}
        self._sent_by_class: dict[str | None, int] = {}
        self._class_cap = config.class_waiting_cap
        self._tokenizer = None
        self._renderer: ChatRenderer | None = None
        # a prompt text longer than this can never fit max_model_len tokens (None: no bound known)
        self.max_prompt_chars: int | None = None
        self.message_tokens = 0  # the fewest tokens a chat message adds (``ChatRenderer.turn_special_tokens``)

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model (off the event loop) and start the step thread. Idempotent."""
        if self.engine is None:
            self.engine = await asyncio.to_thread(LLMEngine, self.config)
        if self._thread is None:  # (before the step thread: it alone touches the engine after)
            await asyncio.to_thread(self.engine.prepare_json)
        if self._tokenizer is None and self.engine.tokenizer is not None:
            # the step thread decodes with the engine's tokenizer; encoding here uses its own copy
            self._tokenizer = copy.deepcopy(self.engine.tokenizer)
            self._renderer = ChatRenderer(self._tokenizer)
            chars = self._renderer.max_token_chars()
            self.max_prompt_chars = None if chars is None else chars * self.engine.max_model_len
            self.message_tokens = self._renderer.turn_special_tokens()
        if self._thread is None:
            self._stats = self.engine.stats()
            self._thread = threading.Thread(target=self._run, name="pagegate-engine", daemon=True)
            self._thread.start()

    async def shutdown(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)
        self._fail_all(EngineDeadError("the engine has shut down"))

    @property
    def max_model_len(self) -> int:
        return self._require().max_model_len

    @property
    def vocab_size(self) -> int:
        return self._require().model.arch.vocab_size

    @property
    def max_waiting(self) -> int:
        """Requests one caller's class may hand over at once at most (each prompt of a batch takes a
        place): the queue's size, or a class's share of it when that is smaller, plus the running
        slots an idle engine fills at once (found by QA: with a share of 2 and 4 slots free, a batch
        of 3 prompts was refused while the same 3 sent alone were served)."""
        return min(self.config.max_waiting, self._class_cap) + self.config.max_num_seqs

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    # ---- tokenization -------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        self._require()
        if self._renderer is None:
            raise ValueError("this model has no tokenizer; send token ids")
        return self._renderer.encode(text)

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        """What each token stands for on its own (logprobs' ``token`` and ``bytes``)."""
        self._require()
        if self._renderer is None:
            raise ValueError("this model has no tokenizer; token texts are unknown")
        return self._renderer.token_bytes(ids)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        self._require()
        if self._renderer is None:
            raise ValueError("this model has no tokenizer; send token ids")
        return self._renderer.render(messages)

    # ---- requests -----------------------------------------------------------------------
    def announce(self) -> ArrivalNotice:
        """A request is on its way (its caller is still admitting it): woken from idle, the step
        thread waits for it, up to ``admission_max_wait_ms``, instead of guessing the end of the
        burst. Hand the notice to ``generate(notice=)``, or ``close()`` it when the request will not
        come (it closes itself when dropped). Never blocks."""
        return self._burst.announce()

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, *, request_id: str,
        salt: str | None = None, priority_class: str | None = None, notice: ArrivalNotice | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield ``RequestOutput`` deltas until the request finishes (see ``EngineClient``).
        ``notice``: this request's ``announce()``, consumed as it reaches the step thread (closed
        if it is refused before)."""
        try:
            ids, stream = self._register(prompt, params, request_id, priority_class=priority_class, salt=salt)
        except BaseException:
            if notice is not None:  # refused: the step thread must not wait for it
                notice.close()
            raise
        self._send(_Add(request_id, ids, params, salt, priority_class), notice)

        def stop() -> None:
            self._streams.pop(request_id, None)
            self._retire(request_id)

        try:
            async with contextlib.aclosing(stream_outputs(stream.queue, stop)) as outputs:
                async for item in outputs:
                    yield item
        finally:
            self._streams.pop(request_id, None)

    def submit(
        self, prompt: str | list[int], params: SamplingParams, *, request_id: str, sink,  # noqa: ANN001
        salt: str | None = None, priority_class: str | None = None, notice: ArrivalNotice | None = None,
    ) -> None:
        """``generate`` for a consumer that is not a coroutine (``engine.ipc``'s server: no task per
        request). Each ``RequestOutput``, or the exception that ends the request, goes to
        ``sink.put_nowait`` on this event loop. After the finished output or an exception the
        consumer calls ``release(request_id)``; ``release(request_id, abort=True)`` stops it early.
        Raises what ``generate`` raises before its first yield."""
        try:
            ids, _stream = self._register(prompt, params, request_id, sink, priority_class=priority_class,
                                          salt=salt)
        except BaseException:
            if notice is not None:
                notice.close()
            raise
        self._send(_Add(request_id, ids, params, salt, priority_class), notice)

    def release(self, request_id: str, *, abort: bool = False) -> None:
        """Forget a ``submit``-ted request; with ``abort`` (it has not finished) stop it in the engine."""
        if self._streams.pop(request_id, None) is not None and abort:
            self._retire(request_id)

    def _register(self, prompt: str | list[int], params: SamplingParams, request_id: str,
                  queue=None, *, priority_class: str | None = None,  # noqa: ANN001
                  salt: str | None = None) -> tuple[list[int], _Stream]:
        """Check a new request and open its stream (raises what ``generate`` documents)."""
        engine = self._require()
        if self._dead is not None:
            raise EngineDeadError(f"the engine stopped: {self._dead!r}")
        if self._stopping:  # (found by QA: a request sent after shutdown() waited for ever)
            raise EngineDeadError("the engine has shut down")
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_prompt(ids, params, engine.max_model_len, engine.model.arch.vocab_size, salt)
        if request_id in self._streams or request_id in self._retiring:
            raise ValueError(f"request id {request_id!r} is already in use")
        stats = self._stats
        # requests the next step can admit at once do not wait: found by QA, a burst into an idle
        # engine was refused past the share, then past the queue, with running slots free. At once
        # means a free slot and free KV blocks for the prompt (found by QA: with the pool full of long
        # prompts, or an idle engine's 8 slots taken by 8 prompts the pool held two of, 10 waited
        # against a queue of 4 and another tenant got 503s), and only while the last step left
        # nothing waiting (what waits beside free slots waits for blocks or the step's token budget)
        claim = 0
        if stats is None:
            free = self.config.max_num_seqs
        elif stats.waiting:
            free = 0
        else:
            slots = max(0, self.config.max_num_seqs - stats.running - self._step_claims[1])
            need = -(-(len(ids) + 1) // self.config.block_size) + params.n - 1
            room = stats.kv_blocks_total - stats.kv_blocks_used - self._step_claims[0] - self._claims[0]
            claim = need if slots > self._claims[1] and need <= room else 0
            # (plus those taken into the step in progress: the scheduler counts them as waiting until
            # the step admits them; found by a re-check, a burst's second half got 429s meanwhile)
            free = self._step_claims[1] + min(slots, self._claims[1] + (1 if claim else 0))
        # requests never admitted: not the sequences of admitted ones waiting to be recomputed
        # (preempted, or yielded to another class: found by a re-check, 13 yielded children of one
        # request got another tenant a 503 with no request queued)
        queued = sum(self._waiting_by_class.values())
        # (requests sent and not yet taken: not the aborts among the commands, found by a re-check: a
        # client that left a batch of 24 filled a queue of 3 with its aborts)
        if stats is not None and queued + self._adds_sent - free >= self.config.max_waiting:
            raise EngineOverloadedError("the engine's waiting queue is full; retry later")
        if priority_class is not None:
            held = self._waiting_by_class.get(priority_class, 0) + self._sent_by_class.get(priority_class, 0)
            waits = max(0, queued + sum(self._sent_by_class.values()) - free)
            if min(held, waits) >= self._class_cap:
                raise EngineClassFullError(f"this class already has {held} requests waiting (at most "
                                           f"{self._class_cap}); retry later")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue() if queue is None else queue)
        self._streams[request_id] = stream
        if self._dead is not None:  # died between the check above and the registration
            self._streams.pop(request_id, None)
            raise EngineDeadError(f"the engine stopped: {self._dead!r}")
        if claim:  # its blocks and slot, counted against what the next step has until its figures say
            with self._cv:
                self._claims = (self._claims[0] + claim, self._claims[1] + 1)
        return ids, stream

    async def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with finish reason "abort"."""
        self._send(_Abort(request_id))

    def interrupt_all(self, exc: BaseException) -> int:
        """End every open request's stream with ``exc`` and stop it in the engine (a server whose
        graceful shutdown is running out: ``gateway.shutdown``). Returns how many were open."""
        ids = list(self._streams)
        for request_id in ids:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.put(exc)
                self._retire(request_id)
        return len(ids)

    def stats(self) -> EngineStats:
        """The engine's figures as of its last step (never blocks on the step thread)."""
        if self._stats is None:
            return self._require().stats()
        return self._stats

    # ---- the step thread ----------------------------------------------------------------
    def _retire(self, request_id: str) -> None:
        """Stop a request whose consumer has gone; its id stays taken until the abort is applied."""
        self._retiring.add(request_id)
        with self._cv:
            if self._adds_sent:
                self._unsend(request_id)
        self._send(_Abort(request_id))

    def _send(self, cmd: _Add | _Abort, notice: ArrivalNotice | None = None) -> None:
        with self._cv:
            self._cmds.append(cmd)
            if isinstance(cmd, _Add):
                self._adds_sent += 1
                if cmd.priority_class is not None:
                    sent = self._sent_by_class
                    sent[cmd.priority_class] = sent.get(cmd.priority_class, 0) + 1
            if self._burst.arrived(add=isinstance(cmd, _Add), notice=notice):
                self._cv.notify()

    def _unsend(self, request_id: str) -> None:
        """(``_cv`` held.) The add of a request whose consumer left before the step thread took it,
        taken back: it no longer holds a place in the queue (found by QA: a refused batch's prompts
        held theirs until the next step, and another tenant's request that fitted got a 503
        meanwhile). The abort still follows, to free the request's id."""
        for i, queued in enumerate(self._cmds):
            if isinstance(queued, _Add) and queued.request_id == request_id:
                del self._cmds[i]
                self._adds_sent -= 1
                if queued.priority_class is not None:
                    left = self._sent_by_class[queued.priority_class] - 1
                    if left:
                        self._sent_by_class[queued.priority_class] = left
                    else:
                        del self._sent_by_class[queued.priority_class]
                return

    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                with self._cv:
                    was_idle = not engine.has_unfinished_requests()
                    while not (self._cmds or self._stopping or engine.has_unfinished_requests()):
                        self._cv.wait()
                    tail = was_idle and self._burst.gather(lambda: self._stopping)
                    if self._stopping:
                        return
                    cmds = self._take()
                self._apply_all(engine, cmds)
                while tail:  # the burst's quiet tail, what was taken applied in the meantime
                    with self._cv:
                        tail = self._burst.gather(lambda: self._stopping, resume=True)
                        if self._stopping:
                            return
                        cmds = self._take()
                    self._apply_all(engine, cmds)
                if engine.has_unfinished_requests():
                    streams = self._streams
                    outputs = engine.step()
                    # the figures first: a client that sends its next request as its output arrives
                    # is admitted against this step's, not the one before (its blocks still held)
                    self._stats = engine.stats()
                    self._step_claims = (0, 0)  # (in the figures now)
                    self._waiting_by_class = engine.scheduler.waiting.counts()
                    _deliver([(stream, out) for out in outputs
                              if (stream := streams.get(out.request_id)) is not None])
        except BaseException as exc:  # noqa: BLE001 - any crash must release every waiter
            logger.exception("engine step loop crashed")
            self._dead = exc
            self._fail_all(EngineDeadError(f"the engine stopped: {exc!r}"))

    def _take(self) -> list[_Add | _Abort]:
        """(``_cv`` held.) The queued commands, now the step thread's."""
        cmds, self._cmds = self._cmds, []
        self._sent_by_class, self._adds_sent = {}, 0
        # (several takes may come before one step: the burst's tail)
        self._step_claims = (self._step_claims[0] + self._claims[0], self._step_claims[1] + self._claims[1])
        self._claims = (0, 0)
        self._burst.taken()
        return cmds

    def _apply_all(self, engine: LLMEngine, cmds: list[_Add | _Abort]) -> None:
        for cmd in cmds:
            self._apply(engine, cmd)
        if cmds:
            self._waiting_by_class = engine.scheduler.waiting.counts()
            if not engine.has_unfinished_requests():  # aborts emptied it: no step follows to say so
                self._stats = engine.stats()  # (the last step's running and waiting hold new ones back)
                self._step_claims = (0, 0)

    def _apply(self, engine: LLMEngine, cmd: _Add | _Abort) -> None:
        if isinstance(cmd, _Abort):
            engine.abort_request(cmd.request_id)
            self._retiring.discard(cmd.request_id)
            return
        if cmd.request_id not in self._streams:
            return  # its consumer already left
        try:
            engine.add_request(cmd.request_id, cmd.prompt_token_ids, cmd.params,
                               salt=cmd.salt, priority_class=cmd.priority_class)
        except Exception as exc:  # invalid request: only that stream fails
            self._streams[cmd.request_id].put(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in list(self._streams.values()):
            stream.put(exc)

    def _require(self) -> LLMEngine:
        if self.engine is None:
            raise RuntimeError("AsyncEngine.start() has not been awaited")
        return self.engine


def _served_name(model: str) -> str:
    from engine.weights import served_name

    return served_name(model)
