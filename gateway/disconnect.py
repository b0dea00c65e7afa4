"""Running a request's work until it is done or its client has left (the chat, completion and
embedding routes): the client leaving cancels the work."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from starlette.types import Receive


async def until_done_or_disconnect(work: Coroutine[Any, Any, None], receive: Receive) -> bool:
    """Run ``work`` in this task; False (and ``work`` cancelled) if the client disconnects first.
    One watcher task a request, which cancels this one when the client leaves (a task for the work
    as well, and ``asyncio.wait`` on both, cost ~5% of the event loop's CPU a request)."""
    this = asyncio.current_task()
    assert this is not None
    running, left = True, False

    def on_watch_done(watch: asyncio.Future) -> None:
        nonlocal left
        if running and not watch.cancelled():
            watch.exception()  # retrieved: a receive that failed counts as the client gone, as before
            left = True
            this.cancel()

    cancels_before = this.cancelling()
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    watch.add_done_callback(on_watch_done)
    try:
        await work
    except asyncio.CancelledError:
        if not left or this.uncancel() > cancels_before:  # (a cancellation from outside as well)
            raise
        return False
    finally:
        running = False
        watch.cancel()
    if left:  # the work finished after all (it kept the cancellation to itself)
        this.uncancel()
        return False
    return True


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
