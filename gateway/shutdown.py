"""uvicorn's server, told when its graceful shutdown begins.

On SIGTERM uvicorn stops accepting connections and waits up to its graceful timeout
(``uvicorn_options``: 10 s) for the requests it is serving; past it, it cancels them, and a client
saw its connection cut (a stream without an error event, a JSON answer with no response at all),
while the log got a ``CancelledError`` traceback. ``DrainingServer`` lets them run until
``CUT_BEFORE_S`` before that timeout, then stops the engine requests still open
(``EngineClient.interrupt_all``), and again every ``RECUT_S`` while requests remain (one that was
still being admitted reaches the engine later): each ends as OpenAI's clients understand, a 503
``server_shutting_down`` (a stream: its error event), its usage row and settlement written as for
any engine error, and uvicorn's wait ends before it has anything to cancel."""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn

from engine.outputs import EngineStoppingError

log = logging.getLogger("pagegate.shutdown")

CUT_BEFORE_S = 1.5  # what a stopped request has to write its error, its usage row and its settlement
RECUT_S = 0.1


class DrainingServer(uvicorn.Server):
    _cut_timer: asyncio.TimerHandle | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = self.config.timeout_graceful_shutdown
        if grace is not None:
            at = grace - min(CUT_BEFORE_S, grace / 2)
            self._cut_timer = asyncio.get_running_loop().call_later(at, self._cut, grace)
        try:
            await super().shutdown(sockets)
        finally:
            if self._cut_timer is not None:
                self._cut_timer.cancel()

    def _cut(self, grace: float) -> None:
        if not (self.server_state.connections or self.server_state.tasks):
            return  # all answered: the lifespan is shutting down
        self.cut(grace)
        self._cut_timer = asyncio.get_running_loop().call_later(RECUT_S, self._cut, grace)

    def cut(self, grace: float) -> int:
        """Stop the app's engine requests still running; returns how many."""
        # None: the lifespan never started, or an app that is not ours
        state = getattr(getattr(self.config.app, "state", None), "pagegate", None)
        engine = None if state is None else state.engine
        if engine is None:
            return 0
        stopped = engine.interrupt_all(EngineStoppingError("the server is shutting down"))
        if stopped:
            log.warning("shutting down: %d request(s) still running near the graceful timeout (%s s) stopped "
                        "with a 503 server_shutting_down", stopped, grace)
        return stopped
