"""Where the gateway compiles JSON schemas (``response_format`` json_schema, tool calls): one thread
of its own per process, shared between tenants in turns."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Hashable

from cache.fair_worker import FairWorker
from engine.json_schema import SchemaGrammar, compile_schema

_workers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FairWorker] = weakref.WeakKeyDictionary()


def schema_worker() -> FairWorker:
    """The thread that compiles the running event loop's schemas (``response_format`` json_schema,
    tool calls), shared between tenants in turns (``cache.fair_worker``): a schema's patterns can take
    a few hundred milliseconds to compile (``engine.json_regex``'s bound), which the event loop must
    not wait out, and one tenant's burst of slow schemas (found by QA: eight tenants' held a plain
    request 12 s when they shared the default executor) holds another's by at most the one compiling.
    One per event loop (a server has one; tests run several at once), as a ``FairWorker`` serves
    one loop."""
    loop = asyncio.get_running_loop()
    worker = _workers.get(loop)
    if worker is None:
        worker = _workers[loop] = FairWorker("pagegate-schemas")
    return worker


async def compile_in_turn(share: Hashable, text: str) -> SchemaGrammar:
    """``compile_schema(text)`` on ``schema_worker``, in ``share``'s (the tenant's) turn."""
    return await schema_worker().run(share, compile_schema, text)
