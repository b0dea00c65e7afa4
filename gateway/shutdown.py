"""uvicorn's server, told when its graceful shutdown begins.

On SIGTERM uvicorn stops accepting connections and waits up to its graceful timeout
(``uvicorn_options``: 10 s) for the requests it is serving; past it, it cancels them, and a client
saw its connection cut (a stream without an error event, a JSON answer with no response at all),
while the log got a ``CancelledError`` traceback. ``DrainingServer`` lets them run until
``CUT_BEFORE_S`` before that timeout, then stops the engine requests still open
(``EngineClient.interrupt_all``): each ends as OpenAI's clients understand, a 503
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


class DrainingServer(uvicorn.Server):
    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = self.config.timeout_graceful_shutdown
        timer = None
        if grace is not None:
            timer = asyncio.get_running_loop().call_later(max(0.0, grace - CUT_BEFORE_S), self.cut, grace)
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()

    def cut(self, grace: float) -> int:
        """Stop the app's engine requests still running; returns how many."""
        state = getattr(self.config.app.state, "pagegate", None)  # None: the lifespan never started
        engine = None if state is None else state.engine
        if engine is None:
            return 0
        stopped = engine.interrupt_all(EngineStoppingError("the server is shutting down"))
        if stopped:
            log.warning("shutting down: %d request(s) still running %.1f s before the graceful timeout (%s s) "
                        "stopped with a 503 server_shutting_down", stopped, CUT_BEFORE_S, grace)
        return stopped
