"""Identical cacheable misses in flight at once, answered by one engine request.

Fifty clients sending the same deterministic question at the same moment all miss the cache: the
answer is stored only once the first is done. Without coalescing each runs on the engine and is
billed. Here the first such request of a process *leads*: it runs on the engine as any miss does.
The ones that arrive while it runs *follow*: they wait for its answer and are served it as a
cache hit (nothing charged, ``x-cache: hit``), the answer a cache lookup a moment later would
have found. A leader that ends without an answer to store (an error, a client that left, a
completion clamped by its quota) lands nothing, and each follower then runs on the engine itself.

Only JSON answers lead and follow: a leader's whole answer exists only at its end, so a stream
that followed would wait for its first byte as long as the leader's whole answer takes.

    flights = Flights()
    waiting = flights.follow(key)        # the leader's future, or None
    land = flights.lead(key)             # this request leads: land(answer or None) exactly once
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable


class Flights:
    """The leaders in flight of one process (one event loop), by request key."""

    def __init__(self) -> None:
        self._open: dict[Hashable, asyncio.Future] = {}
        # requests served a leader's answer; and those that waited for one that landed none
        self.coalesced = 0
        self.coalesce_fallbacks = 0

    def __len__(self) -> int:
        return len(self._open)

    def follow(self, key: Hashable) -> asyncio.Future | None:
        """The future of the leader of ``key`` (its answer, or None when it landed none), or None
        when no request of that key is in flight."""
        return self._open.get(key)

    def served(self) -> None:
        """A follower was served its leader's answer."""
        self.coalesced += 1

    def fell_back(self) -> None:
        """A follower waited and got no answer: it goes on by itself (it leads, or runs)."""
        self.coalesce_fallbacks += 1

    def stats(self) -> dict[str, int]:
        return {"coalesced": self.coalesced, "coalesce_fallbacks": self.coalesce_fallbacks}

    def lead(self, key: Hashable) -> Callable[[dict | None], None]:
        """Register the caller as the leader of ``key``; returns ``land``, to be called with the
        answer (or None) when it is known. The first call lands; later ones do nothing."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._open[key] = fut

        def land(answer: dict | None) -> None:
            if self._open.get(key) is fut:
                del self._open[key]
            if not fut.done():
                fut.set_result(answer)

        return land
