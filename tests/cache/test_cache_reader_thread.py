"""The reading of texts (``Verifier.reads``, the guards' checks, the shorthand written out) runs on
the cache's reader thread, never on the event loop that serves every other request."""

import asyncio
import threading
import time

import pytest
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
        self.checks = 0  # checks begun

    def reads(self, text: str) -> bool:
        self.threads.append(threading.current_thread().name)
        return super().reads(text)

    def check(self, query: str, candidate: str) -> Verdict:
        self.threads.append(threading.current_thread().name)
        self.checks += 1
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


async def test_closing_the_cache_under_lookups_fails_none_of_them(make_cache, embedder):
    """A review's find: the reader shut down with its queue cancelled raised CancelledError in
    requests nobody cancelled; lookups under way now finish or are bypassed ("closed")."""
    v = _Watched(busy_s=0.2, vocab=embedder.vocab())
    c = make_cache(verifier=v)
    loose = CachePolicy(threshold=0.5)
    await c.store("acme", chat("How do I enable two-factor authentication?"), answer("Settings > enable"), loose)
    asked = [chat(f"How can I enable two-factor authentication on device {i}?") for i in range(3)]
    running = [asyncio.create_task(c.lookup("acme", body, loose)) for body in asked]
    while v.checks == 0:  # the first check on the reader, the others queued behind it
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.1)  # (the check holds the reader 0.2 s)
    await c.close()
    found = await asyncio.gather(*running)  # (raises if any lookup failed)
    assert all(f.outcome in ("semantic-hit", "miss", "bypass") for f in found), found
    assert (await c.lookup("acme", asked[0], loose)).reason == "closed"
    await c.store("acme", chat("Another question?"), answer("Another answer"), loose)  # skipped, no error


async def test_readings_queued_when_the_cache_closes_still_run(make_cache):
    from cache.semantic_cache import CacheClosed

    c = make_cache()

    def slow(x: int) -> int:
        time.sleep(0.1)
        return x

    queued = [asyncio.create_task(c._read(slow, i)) for i in range(3)]
    await asyncio.sleep(0.02)
    await c.close()
    assert await asyncio.gather(*queued) == [0, 1, 2]
    with pytest.raises(CacheClosed):
        await c._read(slow, 3)


async def test_the_vocabulary_is_copied_off_the_event_loop(make_cache, embedder, monkeypatch):
    """Copying the tokenizer's 30,522 word pieces takes ~35 ms: it held the loop at a cache's first
    lookup (found by measuring the gateway's loop lag with the cache on)."""
    threads: list[str] = []
    vocab = embedder.vocab

    def watched() -> dict[str, int]:
        threads.append(threading.current_thread().name)
        return vocab()

    monkeypatch.setattr(embedder, "vocab", watched)
    c = make_cache()
    await c.lookup("acme", chat("How do I reset my password?"), CachePolicy(threshold=0.5))
    assert threads and threading.main_thread().name not in threads, threads
    assert c.verifier.has_vocab
