"""The reading of texts (``Verifier.reads``, the guards' checks, the shorthand written out) runs on
the cache's reader thread, never on the event loop that serves every other request."""

import asyncio
import threading
import time

from cache_testlib import answer, chat

from cache.api import CachePolicy
from cache.verifier import Verdict, Verifier


class _Watched(Verifier):
    """A verifier that notes the thread of each call; ``busy_s`` makes each check hold the GIL
    that long (pure Python, as the guards' analysis of a long prompt does)."""

    def __init__(self, busy_s: float = 0.0, **kw) -> None:
        super().__init__(**kw)
        self.threads: list[str] = []
        self.busy_s = busy_s

    def reads(self, text: str) -> bool:
        self.threads.append(threading.current_thread().name)
        return super().reads(text)

    def check(self, query: str, candidate: str) -> Verdict:
        self.threads.append(threading.current_thread().name)
        end = time.perf_counter() + self.busy_s
        while time.perf_counter() < end:
            pass
        return super().check(query, candidate)


async def test_reads_and_checks_run_on_the_reader_thread(make_cache, embedder):
    v = _Watched(vocab=embedder.vocab())
    c = make_cache(verifier=v)
    loose = CachePolicy(threshold=0.5)
    await c.store("acme", chat("How do I enable two-factor authentication?"), answer("Settings > enable"), loose)
    assert (await c.lookup("acme", chat("How can I enable two-factor authentication?"), loose)).outcome == "semantic-hit"
    refused = await c.lookup("acme", chat("How do I disable two-factor authentication?"), loose)
    assert refused.outcome == "miss" and refused.reason == "verifier"
    assert v.threads and {name.split("_")[0] for name in v.threads} == {"pg-cache-read"}, v.threads
    assert threading.main_thread().name not in v.threads


async def test_the_event_loop_runs_on_while_the_guards_read(make_cache, embedder):
    """Each check holds the GIL 0.4 s; the loop still gets it back at Python's switch interval
    (5 ms here, 1 ms in the gateway), where the check on the loop held it the whole time."""
    v = _Watched(busy_s=0.4, vocab=embedder.vocab())
    c = make_cache(verifier=v)
    loose = CachePolicy(threshold=0.5)
    await c.store("acme", chat("How do I enable two-factor authentication?"), answer("Settings > enable"), loose)
    await c.lookup("acme", chat("How do I reset my password?"), loose)  # (the index and vocabulary loaded)
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    v.threads.clear()
    found = await c.lookup("acme", chat("How can I enable two-factor authentication?"), loose)
    ticker.cancel()
    assert found.outcome == "semantic-hit" and v.threads  # the check ran, 0.4 s long
    assert max(gaps) < 0.2, f"the loop stalled {max(gaps) * 1000:.0f} ms"
