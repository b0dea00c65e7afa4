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

This file is the engine process's side; the front's is ``engine/remote_engine.py``, the wire
``engine/ipc_wire.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
from pathlib import Path
from typing import Any

from engine.ipc_wire import (
    Framed,
    deltas_fields,
    encode_error,
)
from engine.json_schema import compile_schema, compiler_thread
from engine.outputs import (
    EngineDeadError,
    RequestOutput,
)
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.2  # how often the engine process pushes its figures to the fronts
# a front handed at least RETURN_MIN_FINISHED finished requests by one step (a wave) is expected back
# for this long (its clients' next requests): see ``_ServerConn.expect_return``
RETURN_WAIT_S = 0.02
RETURN_MIN_FINISHED = 4


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
            conn.send(("error", self.rid, encode_error(item)))
            return
        if item.finished:
            conn.finish(self.key, self)
            conn.finished_in_step += 1
            if conn.finished_in_step == 1:  # once the step's outputs are all handed over
                conn._loop.call_soon(conn.expect_return)
        # the front reads no metrics; they would grow the frame with every token
        conn.send(("out", self.rid, deltas_fields(item.deltas), item.prompt_tokens, item.cached_prompt_tokens,
                   item.finished, item.prompt_logprobs))


class _ServerConn(Framed):
    def __init__(self, server: EngineServer, conn_id: int) -> None:
        super().__init__()
        self.server = server
        self.engine = server.engine
        self.prefix = f"f{conn_id}:"  # two fronts may use the same request id
        self.active: dict[str, _Sink] = {}  # engine request ids still running, and their sinks
        self.compiling: dict[str, str] = {}  # schema requests whose grammar compiles: "add", "stop" or "abort"
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
        self.compiling.clear()  # (their compiles end in nothing: _add_compiled finds no entry)
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

    def _add(self, message: tuple, notice: Any) -> None:
        _, rid, prompt, fields, salt, priority_class, _ = message
        key = self.prefix + rid
        sink = _Sink(self, rid, key)
        try:
            params = SamplingParams(*fields)  # checks itself again
            self.engine.submit(prompt, params, request_id=key, sink=sink, salt=salt,
                               priority_class=priority_class, notice=notice)
        except Exception as exc:  # noqa: BLE001 - refused: only this request fails
            if notice is not None:
                notice.close()
            self.send(("error", rid, encode_error(exc)))
            return
        self.active[key] = sink

    def _add_compiled(self, message: tuple, notice: Any) -> None:
        """A schema's request, once its grammar is compiled (and kept): added, unless its front
        gave it up meanwhile (or went away: then nothing is left to answer)."""
        then = self.compiling.pop(self.prefix + message[1], "abort")
        if then == "abort" or self.transport is None or self.transport.is_closing():
            if notice is not None:
                notice.close()
            return
        self._add(message, notice)
        if then == "stop" and self.prefix + message[1] in self.active:
            self._loop.create_task(self.engine.abort(self.prefix + message[1]))

    def finish(self, key: str, sink: _Sink) -> None:
        if self.active.get(key) is sink:  # not a newer request that reuses an aborted one's id
            del self.active[key]
            self.engine.release(key)

    def received(self, message: tuple) -> None:
        kind = message[0]
        if kind == "add":
            _, rid, prompt, fields, salt, priority_class, nid = message
            notice = self.notices.pop(nid, None) if nid is not None else None
            schema = fields[_SCHEMA_FIELD] if len(fields) > _SCHEMA_FIELD else None
            if isinstance(schema, str):  # compiled on a thread first, not on this loop every front shares
                key = self.prefix + rid
                self.compiling[key] = "add"
                done = self._loop.run_in_executor(compiler_thread(), _compile_quietly, schema)
                done.add_done_callback(lambda _: self._add_compiled(message, notice))
            else:
                self._add(message, notice)
        elif kind == "abort":  # the front closed the stream: nobody reads the rest
            key = self.prefix + message[1]
            if key in self.compiling:
                self.compiling[key] = "abort"
            elif self.active.pop(key, None) is not None:
                self.engine.release(key, abort=True)
        elif kind == "stop":  # RemoteEngine.abort(): the stream ends with finish reason "abort"
            key = self.prefix + message[1]
            if key in self.compiling:
                self.compiling[key] = "stop"
            elif key in self.active:
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


_SCHEMA_FIELD = [f.name for f in dataclasses.fields(SamplingParams) if f.init].index("json_schema")


def _compile_quietly(text: str) -> object:
    """Compile a schema's grammar, returned so that the future holds it (``compile_schema`` finds
    it again while it is held) until its request's ``SamplingParams`` do; a schema the fronts let
    through that fails here fails again, with its message, where the request is added."""
    try:
        return compile_schema(text)
    except Exception:  # noqa: BLE001 - reported by _add's SamplingParams
        return None


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
