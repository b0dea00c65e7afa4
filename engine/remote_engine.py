"""The front's side of the engine socket (``engine.ipc`` has the whole picture): ``RemoteEngine``,
an ``engine.protocol.EngineClient`` for an engine served by ``engine.ipc.EngineServer`` in another
process."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from engine.ipc_wire import (
    Framed,
    decode_error,
    params_fields,
)
from engine.outputs import (
    CompletionDelta,
    EngineDeadError,
    EngineStats,
    RequestOutput,
    check_prompt,
    stream_outputs,
)
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

# ---- the front's side -------------------------------------------------------------------------

class RemoteNotice:
    """``AsyncEngine.announce()``'s notice, held by the engine process: ``close()`` withdraws it."""

    __slots__ = ("_client", "nid", "open")

    def __init__(self, client: _ClientConn, nid: int) -> None:
        self._client, self.nid, self.open = client, nid, True

    def close(self) -> None:
        if self.open:
            self.open = False
            self._client.send(("withdraw", self.nid))

    def __enter__(self) -> RemoteNotice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a notice dropped open must not hold the engine's bursts
        if self.open:
            with contextlib.suppress(Exception):  # the collector may run this on any thread
                self._client._loop.call_soon_threadsafe(self.close)


class _ClientConn(Framed):
    def __init__(self, owner: RemoteEngine) -> None:
        super().__init__()
        self.owner = owner
        self.info: asyncio.Future = self._loop.create_future()

    def received(self, message: tuple) -> None:
        kind = message[0]
        owner = self.owner
        if kind == "out":
            _, rid, deltas, prompt_tokens, cached, finished, prompt_logprobs = message
            queue = owner._streams.get(rid)
            if queue is not None:
                queue.put_nowait(RequestOutput(_request_id(rid), [CompletionDelta(*d) for d in deltas],
                                               prompt_tokens, cached, finished, prompt_logprobs=prompt_logprobs))
        elif kind == "error":
            queue = owner._streams.get(message[1])
            if queue is not None:
                queue.put_nowait(decode_error(message[2]))
        elif kind == "stats":
            owner._stats, owner._engine_dead = message[1], message[2]
        elif kind == "info":
            if not self.info.done():
                self.info.set_result(message[1])

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.info.done():
            self.info.set_exception(EngineDeadError(f"the engine process closed the connection ({exc!r})"))
        self.owner._lost(exc)


_WIRE_SEP = "\x1f"  # between a request id and its sequence number in a wire id


def _request_id(wire: str) -> str:
    return wire.rpartition(_WIRE_SEP)[0]


class RemoteEngine:
    """An ``EngineClient`` for an engine served by ``engine.ipc.EngineServer`` at ``path``."""

    def __init__(self, path: str | Path, *, connect_timeout_s: float = 600.0) -> None:
        self.path = str(path)
        self.connect_timeout_s = connect_timeout_s
        self.model_id = ""
        self.max_model_len = 0
        self.vocab_size: int | None = None
        self.max_prompt_chars: int | None = None
        self.message_tokens = 0  # (as AsyncEngine's, from this process's own renderer)
        self.max_waiting: int | None = None  # the engine's (it refuses requests past it)
        self.engine_pid: int | None = None
        self._conn: _ClientConn | None = None
        # the engine process knows each request by a wire id (the request id and a sequence number):
        # outputs of a request whose stream closed, still on their way, never reach a newer request
        # that reuses its id
        self._streams: dict[str, asyncio.Queue] = {}  # wire id -> its stream's queue
        self._wire_of: dict[str, str] = {}  # request id -> wire id
        self._wire_ids = itertools.count(1)
        self._stats: EngineStats | None = None
        self._engine_dead = False
        self._lost_reason: str | None = None
        self._renderer = None
        self._notice_ids = itertools.count(1)
        self._closing = False
        # called once if the connection to the engine is lost while this front is not shutting
        # down (``gateway.app``: the worker stops, and its supervisor starts it again or stops all)
        self.on_lost: Any = None

    async def start(self) -> None:
        """Connect (waiting for the engine process to be listening, up to ``connect_timeout_s``),
        read what the engine serves and load its tokenizer (off the event loop)."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                _, conn = await loop.create_unix_connection(lambda: _ClientConn(self), self.path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise EngineDeadError(f"no engine is listening at {self.path}") from None
                await asyncio.sleep(0.1)
        self._conn = conn
        info = await asyncio.wait_for(conn.info, timeout=max(1.0, deadline - time.monotonic()))
        self.model_id = info["model_id"]
        self.max_model_len = info["max_model_len"]
        self.vocab_size = info["vocab_size"]
        self.max_prompt_chars = info["max_prompt_chars"]
        self.max_waiting = info["max_waiting"]
        self.engine_pid = info["pid"]
        self._stats = info["stats"]
        self._renderer = await asyncio.to_thread(_load_renderer, info["model_dir"])
        if self._renderer is not None:
            self.message_tokens = await asyncio.to_thread(self._renderer.turn_special_tokens)

    async def shutdown(self) -> None:
        self._closing = True
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()
        self._lost(None)

    @property
    def is_dead(self) -> bool:
        return self._lost_reason is not None or self._engine_dead

    def _lost(self, exc: Exception | None) -> None:
        if self._lost_reason is None:
            self._lost_reason = "the front is shutting down" if self._closing else \
                f"the engine process went away ({exc!r})" if exc else "the engine process closed the connection"
            if not self._closing:
                log.error("engine ipc: %s", self._lost_reason)
                if self.on_lost is not None:
                    self.on_lost()
        dead = EngineDeadError(f"the engine stopped: {self._lost_reason}")
        for queue in list(self._streams.values()):
            queue.put_nowait(dead)

    # ---- tokenization (in this process) -----------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self._renderer is None:
            raise ValueError("this model has no tokenizer; send token ids")
        return self._renderer.encode(text)

    def token_bytes(self, ids: list[int]) -> list[bytes]:
        """What each token stands for on its own (logprobs' ``token`` and ``bytes``)."""
        if self._renderer is None:
            raise ValueError("this model has no tokenizer; token texts are unknown")
        return self._renderer.token_bytes(ids)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if self._renderer is None:
            raise ValueError("this model has no tokenizer; send token ids")
        return self._renderer.render(messages)

    # ---- requests ---------------------------------------------------------------------------
    def announce(self) -> RemoteNotice | None:
        """Never raises (as ``AsyncEngine.announce``): without a live engine there is nothing to
        announce to (None), and ``generate`` says why."""
        conn = self._conn
        if conn is None or self.is_dead:
            return None
        notice = RemoteNotice(conn, next(self._notice_ids))
        conn.send(("announce", notice.nid))
        return notice

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, *, request_id: str,
        salt: str | None = None, priority_class: str | None = None, notice: RemoteNotice | None = None,
    ) -> AsyncIterator[RequestOutput]:
        try:
            conn = self._require()
            ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
            check_prompt(ids, params, self.max_model_len, self.vocab_size, salt)  # at once, no round trip
            if request_id in self._wire_of:
                raise ValueError(f"request id {request_id!r} is already in use")
        except BaseException:
            if notice is not None:
                notice.close()
            raise
        queue: asyncio.Queue = asyncio.Queue()
        wire = f"{request_id}{_WIRE_SEP}{next(self._wire_ids)}"
        self._streams[wire] = queue
        self._wire_of[request_id] = wire
        nid = None
        if notice is not None and notice.open:
            notice.open = False  # consumed by the engine process with the request
            nid = notice.nid
        conn.send(("add", wire, ids, params_fields(params), salt, priority_class, nid))

        def stop() -> None:
            self._forget(request_id, wire)
            if self._conn is not None and self._conn.transport is not None:
                self._conn.send(("abort", wire))

        try:
            async with contextlib.aclosing(stream_outputs(queue, stop)) as outputs:
                async for item in outputs:
                    yield item
        finally:
            self._forget(request_id, wire)

    def _forget(self, request_id: str, wire: str) -> None:
        self._streams.pop(wire, None)
        if self._wire_of.get(request_id) == wire:
            del self._wire_of[request_id]

    async def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with finish reason "abort"."""
        wire = self._wire_of.get(request_id)
        if self._conn is not None and wire is not None:
            self._conn.send(("stop", wire))

    def interrupt_all(self, exc: BaseException) -> int:
        """``AsyncEngine.interrupt_all`` for this front's requests (the engine process's others go on)."""
        wires = list(self._wire_of.items())
        conn = self._conn
        for request_id, wire in wires:
            queue = self._streams.get(wire)
            self._forget(request_id, wire)
            if queue is not None:
                queue.put_nowait(exc)
                if conn is not None and conn.transport is not None:
                    conn.send(("abort", wire))
        return len(wires)

    def stats(self) -> EngineStats:
        """The engine's figures as last pushed (every ``engine.ipc.STATS_INTERVAL_S`` while they change)."""
        if self._stats is None:
            raise RuntimeError("RemoteEngine.start() has not been awaited")
        return self._stats

    def _require(self) -> _ClientConn:
        if self._conn is None:
            raise RuntimeError("RemoteEngine.start() has not been awaited")
        if self.is_dead:
            raise EngineDeadError(f"the engine stopped: {self._lost_reason or 'its step loop crashed'}")
        return self._conn


def _load_renderer(model_dir: str):  # noqa: ANN202
    from engine.tokenizer import ChatRenderer, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    return None if tokenizer is None else ChatRenderer(tokenizer)
