"""The engine in its own process, reached over a Unix socket by several front processes.

    front process (gateway worker)             engine process
    RemoteEngine.generate ── "add" ────────►   EngineServer ─► AsyncEngine.submit ─► step thread
    async iterator        ◄─ "out" (a step's outputs for this front, one frame) ──┘

One event loop runs a front's HTTP, auth, limits and quota; with one process it also feeds the
engine, so a wave of 50 requests is admitted one after the other on one core. With the engine
here, each front process admits its share of the wave on its own core and hands the requests
over; the engine's own process does nothing else (vLLM's split between its API servers and its
engine core).

``RemoteEngine`` fills ``engine.protocol.EngineClient`` like ``AsyncEngine`` does: the same
errors before the first output (``PromptTooLongError``, ``EngineOverloadedError``,
``EngineDeadError``, ``ValueError``), closing the stream aborts the request, ``announce()``
notices reach the engine's burst gate. It tokenizes in its own process (the engine sends where
its tokenizer lies), so prompts are rendered on the fronts' cores too.

Wire: frames of a 4-byte big-endian length and a pickled list of messages (tuples); each side
sends at most one frame per event-loop turn (a step's outputs for one front go in one frame).
Requests' parameters and outputs travel as tuples of their fields; unpickling admits builtins
and the engine's figures (``EngineStats``) only. The socket is created
owner-only (0600) in a directory the caller owns: only the same user's processes connect.
If the engine process goes away, every open stream of a front gets ``EngineDeadError`` and
``is_dead`` turns true (the gateway answers 503); the supervisor (``pagegate serve --workers``)
stops the whole service.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import itertools
import logging
import operator
import os
import pickle
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from engine.outputs import (
    CompletionDelta,
    EngineClassFullError,
    EngineDeadError,
    EngineError,
    EngineOverloadedError,
    EngineStats,
    EngineStoppingError,
    PromptTooLongError,
    RequestOutput,
    check_prompt,
    stream_outputs,
)
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024  # a longer length is a broken or hostile peer: the connection is dropped
STATS_INTERVAL_S = 0.2  # how often the engine process pushes its figures to the fronts
# a front handed at least RETURN_MIN_FINISHED finished requests by one step (a wave) is expected back
# for this long (its clients' next requests): see ``_ServerConn.expect_return``
RETURN_WAIT_S = 0.02
RETURN_MIN_FINISHED = 4

# The wire carries builtins (tuples, lists, str, int, float, None) and the engine's figures; a
# request's sampling parameters and its outputs go as tuples of their fields (unpickling a slots
# dataclass runs Python code per object: 4-6x the cost of its tuple, on every step's outputs).
_ALLOWED = {("engine.outputs", "EngineStats"): EngineStats}
_PARAMS = tuple(f.name for f in dataclasses.fields(SamplingParams))
_params_fields = operator.attrgetter(*_PARAMS)


def _deltas_fields(deltas: list[CompletionDelta]) -> list[tuple]:
    return [(d.index, d.text, d.token_ids, d.finish_reason, d.num_tokens, d.logprobs) for d in deltas]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        cls = _ALLOWED.get((module, name))
        if cls is None:
            raise pickle.UnpicklingError(f"engine ipc: {module}.{name} is not allowed on the wire")
        return cls


def _loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def _frame(messages: list) -> bytes:
    body = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


class _Framed(asyncio.Protocol):
    """Frames in, frames out; outgoing messages of one event-loop turn go in one frame."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._outbox: list = []
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, message: tuple) -> None:
        self._outbox.append(message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        box, self._outbox = self._outbox, []
        if box and self.transport is not None and not self.transport.is_closing():
            self.transport.write(_frame(box))

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = _HEADER.unpack_from(buf, pos)
            if size > MAX_FRAME:
                log.error("engine ipc: a frame of %d bytes; dropping the connection", size)
                self.transport.close()
                return
            if len(buf) - pos - 4 < size:
                break
            try:
                messages = _loads(bytes(buf[pos + 4:pos + 4 + size]))
            except Exception:  # noqa: BLE001 - a broken peer: drop it, never the process
                log.exception("engine ipc: an unreadable frame; dropping the connection")
                self.transport.close()
                return
            pos += 4 + size
            for message in messages:
                self.received(message)
        if pos:
            del buf[:pos]

    def received(self, message: tuple) -> None:
        raise NotImplementedError


# ---- errors on the wire -----------------------------------------------------------------------

def _encode_error(exc: BaseException) -> tuple:
    if isinstance(exc, PromptTooLongError):
        return ("too_long", exc.prompt_tokens, exc.max_model_len)
    if isinstance(exc, EngineClassFullError):
        return ("class_full", str(exc))
    if isinstance(exc, EngineOverloadedError):
        return ("overloaded", str(exc))
    if isinstance(exc, EngineDeadError):
        return ("dead", str(exc))
    if isinstance(exc, EngineStoppingError):
        return ("stopping", str(exc))
    if isinstance(exc, ValueError):
        return ("value", str(exc))
    return ("engine", f"{type(exc).__name__}: {exc}")


def _decode_error(code: tuple) -> BaseException:
    kind = code[0]
    if kind == "too_long":
        return PromptTooLongError(code[1], code[2])
    if kind == "class_full":
        return EngineClassFullError(code[1])
    if kind == "overloaded":
        return EngineOverloadedError(code[1])
    if kind == "dead":
        return EngineDeadError(code[1])
    if kind == "stopping":
        return EngineStoppingError(code[1])
    if kind == "value":
        return ValueError(code[1])
    return EngineError(code[1])


# ---- the engine process's side ----------------------------------------------------------------

class EngineServer:
    """Serves an ``AsyncEngine`` (started by the caller) on a Unix socket at ``path``."""

    def __init__(self, engine: Any, path: str | Path) -> None:
        self.engine = engine
        self.path = str(path)
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[_ServerConn] = set()
        self._ids = itertools.count(1)
        self._stats_task: asyncio.Task | None = None

    def info(self) -> dict:
        eng = self.engine
        return {"model_id": eng.model_id, "max_model_len": eng.max_model_len, "vocab_size": eng.vocab_size,
                "max_prompt_chars": eng.max_prompt_chars, "max_waiting": eng.max_waiting, "model_dir": str(eng.engine.model_dir),
                "stats": eng.stats(), "pid": os.getpid()}

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        old = os.umask(0o177)  # the socket is born owner-only
        try:
            self._server = await asyncio.get_running_loop().create_unix_server(
                lambda: _ServerConn(self, next(self._ids)), self.path)
        finally:
            os.umask(old)
        self._stats_task = asyncio.create_task(self._push_stats())

    @property
    def fronts(self) -> int:
        """Fronts connected now."""
        return len(self._conns)

    async def close(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stats_task
        if self._server is not None:
            self._server.close()
            for conn in list(self._conns):
                conn.transport.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _push_stats(self) -> None:
        last = None
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            stats = self.engine.stats()
            dead = self.engine.is_dead
            if (stats, dead) != last:
                last = (stats, dead)
                for conn in self._conns:
                    conn.send(("stats", stats, dead))


class _Sink:
    """Where ``AsyncEngine.submit`` puts one request's outputs: into its front's next frame."""

    __slots__ = ("conn", "rid", "key")

    def __init__(self, conn: _ServerConn, rid: str, key: str) -> None:
        self.conn, self.rid, self.key = conn, rid, key

    def put_nowait(self, item: RequestOutput | BaseException) -> None:
        conn = self.conn
        if isinstance(item, BaseException):
            conn.finish(self.key, self)
            conn.send(("error", self.rid, _encode_error(item)))
            return
        if item.finished:
            conn.finish(self.key, self)
            conn.finished_in_step += 1
            if conn.finished_in_step == 1:  # once the step's outputs are all handed over
                conn._loop.call_soon(conn.expect_return)
        # the front reads no metrics; they would grow the frame with every token
        conn.send(("out", self.rid, _deltas_fields(item.deltas), item.prompt_tokens, item.cached_prompt_tokens,
                   item.finished))


class _ServerConn(_Framed):
    def __init__(self, server: EngineServer, conn_id: int) -> None:
        super().__init__()
        self.server = server
        self.engine = server.engine
        self.prefix = f"f{conn_id}:"  # two fronts may use the same request id
        self.active: dict[str, _Sink] = {}  # engine request ids still running, and their sinks
        self.notices: dict[int, Any] = {}
        self.return_notice: Any = None
        self.finished_in_step = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server._conns.add(self)
        self.send(("info", self.server.info()))

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._conns.discard(self)
        for key in list(self.active):  # the front went away: its requests stop, their blocks free
            self.engine.release(key, abort=True)
        self.active.clear()
        self.finished_in_step = 0
        for notice in self.notices.values():
            notice.close()
        self.notices.clear()
        self._returned()

    def expect_return(self) -> None:
        """(After a step's outputs are handed over.) This front was just handed a wave of finished
        requests (``RETURN_MIN_FINISHED`` or more): its clients' next requests are likely on their
        way, but the front has not read them yet (it is still writing the responses, or waiting
        for a core). With one front, its own notices cover the wave (each request is announced
        once its key is known, and one event loop reads the whole wave before any of it is
        admitted); with several, the fronts run unsynchronised, and a step started on the first
        front's wave would leave the second's a whole step behind. So the engine, woken from
        idle, also waits for each such front's first message (a notice or a request), at most
        ``RETURN_WAIT_S`` after the hand-over and the burst gate's ``max_wait`` in all. Fewer
        finished requests (one client's, say) set no expectation: its next request may come
        through another worker, or never, and nobody else should wait for it."""
        finished, self.finished_in_step = self.finished_in_step, 0
        if finished < RETURN_MIN_FINISHED or self.transport is None or self.transport.is_closing():
            return
        if self.return_notice is None:
            self.return_notice = self.engine.announce()
            self._loop.call_later(RETURN_WAIT_S, self._returned, self.return_notice)

    def _returned(self, notice: Any = None) -> None:
        current = self.return_notice
        if current is not None and (notice is None or notice is current):
            self.return_notice = None
            current.close()

    def finish(self, key: str, sink: _Sink) -> None:
        if self.active.get(key) is sink:  # not a newer request that reuses an aborted one's id
            del self.active[key]
            self.engine.release(key)

    def received(self, message: tuple) -> None:
        kind = message[0]
        if kind == "add":
            _, rid, prompt, fields, salt, priority_class, nid = message
            notice = self.notices.pop(nid, None) if nid is not None else None
            key = self.prefix + rid
            sink = _Sink(self, rid, key)
            try:
                params = SamplingParams(*fields)  # checks itself again
                self.engine.submit(prompt, params, request_id=key, sink=sink, salt=salt,
                                   priority_class=priority_class, notice=notice)
            except Exception as exc:  # noqa: BLE001 - refused: only this request fails
                if notice is not None:
                    notice.close()
                self.send(("error", rid, _encode_error(exc)))
                return
            self.active[key] = sink
        elif kind == "abort":  # the front closed the stream: nobody reads the rest
            key = self.prefix + message[1]
            if self.active.pop(key, None) is not None:
                self.engine.release(key, abort=True)
        elif kind == "stop":  # RemoteEngine.abort(): the stream ends with finish reason "abort"
            key = self.prefix + message[1]
            if key in self.active:
                self._loop.create_task(self.engine.abort(key))
        elif kind == "announce":
            self.notices[message[1]] = self.engine.announce()
        elif kind == "withdraw":
            notice = self.notices.pop(message[1], None)
            if notice is not None:
                notice.close()
        else:
            log.warning("engine ipc: unknown message %r", kind)
            return
        if kind in ("add", "announce") and self.return_notice is not None:  # the front is back
            self._returned()


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


class _ClientConn(_Framed):
    def __init__(self, owner: RemoteEngine) -> None:
        super().__init__()
        self.owner = owner
        self.info: asyncio.Future = self._loop.create_future()

    def received(self, message: tuple) -> None:
        kind = message[0]
        owner = self.owner
        if kind == "out":
            _, rid, deltas, prompt_tokens, cached, finished = message
            queue = owner._streams.get(rid)
            if queue is not None:
                queue.put_nowait(RequestOutput(_request_id(rid), [CompletionDelta(*d) for d in deltas],
                                               prompt_tokens, cached, finished))
        elif kind == "error":
            queue = owner._streams.get(message[1])
            if queue is not None:
                queue.put_nowait(_decode_error(message[2]))
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
    """An ``EngineClient`` for an engine served by ``EngineServer`` at ``path``."""

    def __init__(self, path: str | Path, *, connect_timeout_s: float = 600.0) -> None:
        self.path = str(path)
        self.connect_timeout_s = connect_timeout_s
        self.model_id = ""
        self.max_model_len = 0
        self.vocab_size: int | None = None
        self.max_prompt_chars: int | None = None
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
            check_prompt(ids, params, self.max_model_len, self.vocab_size)  # at once, no round trip
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
        conn.send(("add", wire, ids, _params_fields(params), salt, priority_class, nid))

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
        """The engine's figures as last pushed (every ``STATS_INTERVAL_S`` while they change)."""
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


DRAIN_TIMEOUT_S = 12.0  # past the fronts' own graceful timeout (10 s): they close first


async def serve_engine(config: Any, path: str | Path, *, ready: Any = None, drain: asyncio.Event | None = None,
                       drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """Run an ``AsyncEngine`` for ``config`` behind an ``EngineServer`` at ``path`` until cancelled;
    raises ``EngineDeadError`` if its step loop dies. ``ready()`` is called once the socket listens.
    Once ``drain`` is set it returns when no front is connected any more, or ``drain_timeout_s``
    later (a SIGTERM that reached the fronts too: they finish their requests first)."""
    from engine.async_engine import AsyncEngine

    engine = AsyncEngine(config)
    await engine.start()
    server = EngineServer(engine, path)
    await server.start()
    try:
        if ready is not None:
            ready()
        deadline = None
        while not engine.is_dead:  # a crashed step loop ends the process: its supervisor acts on that
            if drain is not None and drain.is_set():
                loop_time = asyncio.get_running_loop().time()
                deadline = loop_time + drain_timeout_s if deadline is None else deadline
                if not server.fronts or loop_time >= deadline:
                    return
            await asyncio.sleep(0.05 if deadline is not None else 0.2)
        raise EngineDeadError("the engine's step loop stopped")
    finally:
        await server.close()
        await engine.shutdown()
