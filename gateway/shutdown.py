"""uvicorn's server, told when its graceful shutdown begins.

On SIGTERM uvicorn stops accepting connections and waits up to its graceful timeout
(``uvicorn_options``: 10 s) for the requests it is serving; past it, it cancels them, and a client
saw its connection cut (a stream without an error event, a JSON answer with no response at all),
while the log got a ``CancelledError`` traceback. ``DrainingServer`` lets them run until
``CUT_BEFORE_S`` before that timeout, then stops the engine requests still open
(``EngineClient.interrupt_all``), and again every ``RECUT_S`` while requests remain (one that was
still being admitted reaches the engine later): each ends as OpenAI's clients understand, a 503
``server_shutting_down`` (a stream: its error event), its usage row and settlement written as for
any engine error. ``ANSWER_AFTER_S`` later, requests still without a response that the engine
does not hold (an embedding batch, one stuck in admission) are cancelled, and the gateway's
middleware answers each with the same 503 (``gateway.middleware.Unanswered``). So uvicorn's wait
ends before it has anything to cancel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from types import FrameType

import uvicorn

from engine.outputs import EngineStoppingError
from gateway.middleware import Unanswered

log = logging.getLogger("pagegate.shutdown")

CUT_BEFORE_S = 1.5  # what a stopped request has to write its error, its usage row and its settlement
RECUT_S = 0.1
ANSWER_AFTER_S = 0.5  # what an engine request stopped by the cut has to answer by itself
REFUSE_NEW_S = 0.25  # new requests refused (503) before the listening sockets close
FORCED_REQUESTS_S = 1.0  # after a second Ctrl+C: the requests just cut, to write their errors and rows
FORCED_LIFESPAN_S = 5.0  # then the app's own shutdown


_WHEN = {False: "near the graceful timeout", True: "at the second signal (forced quit)"}


class DrainingServer(uvicorn.Server):
    _cut_timer: asyncio.TimerHandle | None = None
    _loop: asyncio.AbstractEventLoop | None = None  # the server's, once it starts

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._answered: set[asyncio.Task] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = self.config.timeout_graceful_shutdown
        loop = asyncio.get_running_loop()
        unanswered = self._unanswered()
        if unanswered is not None and not self.force_exit:
            # closing the listening sockets resets the connections still in their accept queue (a
            # client sees its connection cut): for a moment new requests are accepted and refused
            # with a 503 the SDKs retry, then the sockets close
            unanswered.refusing = True
            await asyncio.sleep(REFUSE_NEW_S)
        if grace is not None:
            at = grace - min(CUT_BEFORE_S, grace / 2)
            self._cut_timer = loop.call_later(at, self._cut, grace, loop.time() + at)
        try:
            await super().shutdown(sockets)
            done = getattr(self.lifespan, "shutdown_event", None)
            if self.force_exit and self.started and done is not None and not done.is_set():
                # uvicorn skips the app's shutdown when forced: the app would then be torn down by
                # the loop's cancellation (a traceback, usage rows left in the journal until the next
                # start). The requests just cut get a moment to write their errors and rows, then the
                # app's shutdown runs here, bounded.
                if self.server_state.tasks:
                    await asyncio.wait(set(self.server_state.tasks), timeout=FORCED_REQUESTS_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.lifespan.shutdown()), FORCED_LIFESPAN_S)
        finally:
            if self._cut_timer is not None:
                self._cut_timer.cancel()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A second Ctrl+C ("CTRL+C to force quit"): uvicorn stops waiting and the requests are
        cancelled within 0.1 s; the cut and the answers go first, so they end as at the timeout."""
        forced = self.force_exit
        super().handle_exit(sig, frame)
        if self.force_exit and not forced and self._loop is not None:
            grace = self.config.timeout_graceful_shutdown or 0.0
            self._loop.call_soon_threadsafe(self._force_cut, grace)

    def _force_cut(self, grace: float) -> None:
        self.cut(grace, forced=True)
        self.answer_unanswered(forced=True)

    def _cut(self, grace: float, first: float) -> None:
        if not (self.server_state.connections or self.server_state.tasks):
            return  # all answered: the lifespan is shutting down
        self.cut(grace)
        loop = asyncio.get_running_loop()
        if loop.time() >= first + ANSWER_AFTER_S:
            self.answer_unanswered()
        self._cut_timer = loop.call_later(RECUT_S, self._cut, grace, first)

    def _unanswered(self) -> Unanswered | None:
        return getattr(getattr(self.config.app, "state", None), "unanswered", None)  # None: not our app

    def answer_unanswered(self, *, forced: bool = False) -> int:
        """Cancel the requests still without a response (once each): the middleware answers them."""
        unanswered = self._unanswered()
        if not unanswered:
            return 0
        unanswered.stopping = True
        tasks = [t for t in unanswered if t not in self._answered]
        for task in tasks:
            self._answered.add(task)
            task.cancel()
        if tasks:
            log.warning("shutting down: %d request(s) without a response %s answered with a 503 "
                        "server_shutting_down", len(tasks), _WHEN[forced])
        return len(tasks)

    def cut(self, grace: float, *, forced: bool = False) -> int:
        """Stop the app's engine requests still running; returns how many."""
        # None: the lifespan never started, or an app that is not ours
        state = getattr(getattr(self.config.app, "state", None), "pagegate", None)
        engine = None if state is None else state.engine
        if engine is None:
            return 0
        stopped = engine.interrupt_all(EngineStoppingError("the server is shutting down"))
        if stopped:  # (found by QA: a second Ctrl+C's cut was logged as the timeout's)
            when = _WHEN[True] if forced else f"{_WHEN[False]} ({grace} s)"
            log.warning("shutting down: %d request(s) still running %s stopped with a 503 server_shutting_down",
                        stopped, when)
        return stopped
