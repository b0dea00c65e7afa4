"""Exact and semantic tiers against real Redis: isolation, parameters, turns, policy."""

import pytest
from cache_testlib import answer, chat

from cache.api import CachePolicy
from cache.verifier import Verifier


async def test_exact_then_semantic_hit(make_cache, policy):
    c = make_cache()
    body = chat("How do I reset my password?")
    assert (await c.lookup("acme", body, policy)).outcome == "miss"
    await c.store("acme", body, answer("Use the reset link."), policy)
    hit = await c.lookup("acme", body, policy)
    assert hit.outcome == "hit" and hit.similarity == 1.0
    assert hit.response["choices"][0]["message"]["content"] == "Use the reset link."
    sem = await c.lookup("acme", chat("How can I reset my password?"), policy)
    assert sem.outcome == "semantic-hit" and policy.threshold <= sem.similarity < 1.0
    assert sem.response["choices"][0]["message"]["content"] == "Use the reset link."


async def test_tenant_isolation_exact_and_semantic(make_cache, policy):
    c = make_cache()
    body = chat("What is the refund policy?")
    await c.store("tenant-a", body, answer("A's secret policy"), policy)
    assert (await c.lookup("tenant-a", body, policy)).outcome == "hit"
    for q in ("What is the refund policy?", "What's the refund policy?"):
        r = await c.lookup("tenant-b", chat(q), policy)
        assert r.outcome == "miss" and r.response is None
    # and B's own entry never leaks back to A
    await c.store("tenant-b", body, answer("B's policy"), policy)
    assert (await c.lookup("tenant-a", body, policy)).response["choices"][0]["message"]["content"] == (
        "A's secret policy")


@pytest.mark.parametrize("change", [dict(max_tokens=5), dict(stop=["."]),  # (a seed: only when sampled, test_cache_canonical)
                                    dict(top_p=0.5), dict(n=2), dict(top_k=3),
                                    dict(model="another-model"),
                                    dict(response_format={"type": "json_object"})])
async def test_parameters_are_part_of_the_key(make_cache, policy, change):
    c = make_cache()
    await c.store("acme", chat("Name three primary colors."), answer("red, yellow, blue"), policy)
    for text in ("Name three primary colors.", "List three primary colors."):
        r = await c.lookup("acme", chat(text) | change, policy)
        assert r.outcome == "miss", (change, r)


async def test_multi_turn_same_last_message_different_history(make_cache, policy):
    c = make_cache()
    h1 = [{"role": "user", "content": "Tell me about the Eiffel Tower."}, {"role": "assistant", "content": "..."}]
    h2 = [{"role": "user", "content": "Tell me about the Colosseum."}, {"role": "assistant", "content": "..."}]
    await c.store("acme", chat("How tall is it?", history=h1), answer("330 m"), policy)
    assert (await c.lookup("acme", chat("How tall is it?", history=h1), policy)).outcome == "hit"
    assert (await c.lookup("acme", chat("How tall is it exactly?", history=h1), policy)).outcome == "semantic-hit"
    for q in ("How tall is it?", "How tall is it exactly?"):
        assert (await c.lookup("acme", chat(q, history=h2), policy)).outcome == "miss"
        assert (await c.lookup("acme", chat(q), policy)).outcome == "miss"


async def test_hard_negative_rejected_by_verifier(make_cache):
    c = make_cache()
    loose = CachePolicy(threshold=0.5)
    await c.store("acme", chat("How do I enable two-factor authentication?"), answer("Settings > enable"), loose)
    r = await c.lookup("acme", chat("How do I disable two-factor authentication?"), loose)
    assert r.outcome == "miss" and r.reason == "verifier"
    assert c.stats()["verifier_rejections"] == 1


@pytest.mark.parametrize("stored,asked,paraphrase", [
    ("How many ounces in a pound?", "How many pounds in an ounce?", "How many ounces are there in a pound?"),
    ("What is the time complexity of mergesort?", "What is the space complexity of mergesort?",
     "What is mergesort's time complexity?"),
    ("What is the GDP of China?", "What is the GDP per capita of China?", "What's the GDP of China?"),
])
async def test_qa_hard_negatives_miss_at_the_default_threshold(make_cache, stored, asked, paraphrase):
    """QA found these served as semantic hits at 0.90 on a fresh namespace; the paraphrase still hits."""
    c = make_cache()
    default = CachePolicy(threshold=0.90)
    await c.store("acme", chat(stored), answer("16"), default)
    r = await c.lookup("acme", chat(asked), default)
    assert (r.outcome, r.reason) == ("miss", "verifier")
    assert (await c.lookup("acme", chat(paraphrase), default)).outcome == "semantic-hit"


async def test_policy_gates(make_cache, policy):
    c = make_cache()
    body = chat("Ping?")
    await c.store("acme", body, answer("Pong"), policy)
    assert (await c.lookup("acme", body, CachePolicy(no_cache=True))).reason == "no-cache"
    assert (await c.lookup("acme", body, CachePolicy(enabled=False))).reason == "disabled"
    hot = chat("Ping?", temperature=0.7)
    assert (await c.lookup("acme", hot, policy)).reason == "non-deterministic"
    seeded = chat("Ping?", temperature=0.7, seed=1)
    assert (await c.lookup("acme", seeded, policy)).outcome == "miss"  # cacheable, not stored yet
    await c.store("acme", seeded, answer("Pong!"), CachePolicy(no_store=True))
    await c.store("acme", hot, answer("Pong?"), policy)
    await c.store("acme", chat("Other?"), answer("cut", finish="abort"), policy)
    assert (await c.lookup("acme", seeded, policy)).outcome == "miss"
    assert (await c.lookup("acme", chat("Other?"), policy)).outcome == "miss"
    assert c.stats()["store_skips"] == 3 and c.stats()["bypasses"] == 3


async def test_ttl_expiry(make_cache):
    import asyncio
    import time

    c = make_cache()
    short = CachePolicy(threshold=0.8, ttl_s=3)
    await c.store("acme", chat("What is the boiling point of water?"), answer("100 C"), short)
    t0 = time.monotonic()  # the entry expires at most 3 s from here
    assert (await c.lookup("acme", chat("What is the boiling point of water?"), short)).outcome == "hit"
    assert (await c.lookup("acme", chat("What's the boiling point of water?"), short)).outcome == "semantic-hit"
    await asyncio.sleep(max(0.0, 3.2 - (time.monotonic() - t0)))
    r = await c.lookup("acme", chat("What's the boiling point of water?"), short)
    assert r.outcome == "miss" and r.reason == "expired"  # index still had it; Redis did not
    assert (await c.lookup("acme", chat("What is the boiling point of water?"), short)).outcome == "miss"
    assert (await c.lookup("acme", chat("What's the boiling point of water?"), short)).outcome == "miss"


async def test_eviction_at_cap(make_cache, redis_client):
    c, other = make_cache(), make_cache()
    cap = CachePolicy(threshold=0.8, max_entries=3)
    topics = ["volcanoes", "glaciers", "deserts", "rainforests", "coral reefs"]
    assert (await other.lookup("acme", chat("Explain volcanoes briefly"), cap)).outcome == "miss"  # loaded
    for t in topics:
        await c.store("acme", chat(f"Explain {t} briefly"), answer(t), cap)
    keys = c.store_.keys("acme")
    assert await redis_client.zcard(keys.zset) == 3
    assert c.stats()["evictions"] == 2
    for cache in (c, other):
        for t in topics[:2]:
            assert (await cache.lookup("acme", chat(f"Explain {t} briefly"), cap)).outcome == "miss"
        for t in topics[2:]:
            assert (await cache.lookup("acme", chat(f"Explain {t} briefly"), cap)).outcome == "hit"
    # the other process's in-process index dropped the evicted vectors too
    assert other._local.tenant(keys).size() == 3


async def test_the_cap_evicts_the_oldest_stored_when_the_ttl_was_lowered(make_cache, redis_client):
    """Entries stored under a long TTL, then one under a shorter TTL (the admin lowered it): the
    cap evicts the oldest stored, not the one that expires first (the new one, evicted at once:
    a QA find; the tenant's cache then kept nothing new until the old entries expired)."""
    c = make_cache()
    long_ttl = CachePolicy(threshold=0.8, ttl_s=3600, max_entries=3)
    short_ttl = CachePolicy(threshold=0.8, ttl_s=60, max_entries=3)
    topics = ["volcanoes", "glaciers", "deserts"]
    for t in topics:
        await c.store("acme", chat(f"Explain {t} briefly"), answer(t), long_ttl)
    await c.store("acme", chat("Explain coral reefs briefly"), answer("reefs"), short_ttl)
    keys = c.store_.keys("acme")
    assert await redis_client.zcard(keys.zset) == 3 and await redis_client.zcard(keys.stored) == 3
    assert (await c.lookup("acme", chat("Explain coral reefs briefly"), short_ttl)).outcome == "hit"
    assert (await c.lookup("acme", chat("Explain volcanoes briefly"), short_ttl)).outcome == "miss"
    for t in topics[1:]:
        assert (await c.lookup("acme", chat(f"Explain {t} briefly"), short_ttl)).outcome == "hit"


async def test_the_cap_also_evicts_entries_stored_before_the_store_time_set(make_cache, redis_client):
    """Entries from before the store-time set existed (no member there) still count toward the
    cap and go, soonest to expire first, once the tracked ones are not enough."""
    c = make_cache()
    cap = CachePolicy(threshold=0.8, max_entries=2)
    for t in ["volcanoes", "glaciers"]:
        await c.store("acme", chat(f"Explain {t} briefly"), answer(t), cap)
    keys = c.store_.keys("acme")
    await redis_client.delete(keys.stored)  # as an older release left them
    for t in ["deserts", "rainforests"]:
        await c.store("acme", chat(f"Explain {t} briefly"), answer(t), cap)
    assert await redis_client.zcard(keys.zset) == 2
    members = sorted(m.decode() if isinstance(m, bytes) else m for m in await redis_client.zrange(keys.zset, 0, -1))
    assert members == sorted(m.decode() if isinstance(m, bytes) else m
                             for m in await redis_client.zrange(keys.stored, 0, -1))
    for t in ["deserts", "rainforests"]:
        assert (await c.lookup("acme", chat(f"Explain {t} briefly"), cap)).outcome == "hit"


async def test_cross_process_visibility_within_one_second(make_cache, policy):
    import time

    a, b = make_cache(), make_cache()
    assert (await b.lookup("acme", chat("How do I rotate an API key?"), policy)).outcome == "miss"
    await a.store("acme", chat("How do I rotate an API key?"), answer("Admin > keys > rotate"), policy)
    t0 = time.monotonic()
    r = await b.lookup("acme", chat("How can I rotate my API key?"), policy)
    while r.outcome != "semantic-hit" and time.monotonic() - t0 < 1.0:
        r = await b.lookup("acme", chat("How can I rotate my API key?"), policy)
    assert r.outcome == "semantic-hit"
    assert b._local is not None and a._local is not b._local


async def test_cross_process_visibility_subprocess(make_cache, policy, prefix, embedder):
    """A real second process stores (through the store API); this one finds it at once."""
    import asyncio
    import sys
    import textwrap

    c = make_cache()
    question = "What port does Redis use by default?"
    assert (await c.lookup("acme", chat(question), policy)).outcome == "miss"
    vec_hex = (await embedder.embed(question)).tobytes().hex()  # the child needs no model
    code = textwrap.dedent(f"""
        import asyncio, numpy as np, redis.asyncio as R
        from cache.store import EntryStore, NewEntry
        from cache.canonical import canonicalize
        async def main():
            r = R.Redis.from_url("redis://127.0.0.1:6379/4")
            st = EntryStore(r, {prefix!r})
            body = {{"model": "smollm2-135m-instruct", "temperature": 0,
                     "messages": [{{"role": "user", "content": {question!r}}}]}}
            q = canonicalize("acme", body)
            vec = np.frombuffer(bytes.fromhex({vec_hex!r}), np.float32)
            keys = st.keys("acme")
            resp = {{"choices": [{{"index": 0, "message": {{"role": "assistant", "content": "6379"}},
                                   "finish_reason": "stop"}}]}}
            await st.put(keys, NewEntry(q.exact_key, keys.ns(q.context_key), q.query, vec, resp),
                         ttl_s=60, max_entries=10)
            await r.aclose()
        asyncio.run(main())
    """)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code)
    assert await proc.wait() == 0
    r = await c.lookup("acme", chat("Which port does Redis use by default?"), policy)
    assert r.outcome == "semantic-hit" and r.response["choices"][0]["message"]["content"] == "6379"


async def test_log_gap_triggers_reload(make_cache, policy, redis_client):
    a, b = make_cache(), make_cache()
    await b.lookup("acme", chat("warm"), policy)
    await a.store("acme", chat("What is DNS?"), answer("names"), policy)
    keys = a.store_.keys("acme")
    await redis_client.xtrim(keys.log, maxlen=0)  # simulate a reader far behind a trimmed log
    await a.store("acme", chat("What is TCP?"), answer("transport"), policy)
    reloads = b.stats()["index_reloads"]
    assert (await b.lookup("acme", chat("What's DNS?"), policy)).outcome == "semantic-hit"
    assert b.stats()["index_reloads"] == reloads + 1


async def test_concurrent_lookups_share_embedding_batches(make_cache, policy, embedder):
    import asyncio

    c = make_cache()
    await c.store("acme", chat("What is a mutex?"), answer("a lock"), policy)
    before = embedder.batches
    qs = [chat(f"Question number {i} about mutexes?") for i in range(12)]
    rs = await asyncio.gather(*(c.lookup("acme", q, policy) for q in qs))
    assert all(r.outcome in ("miss", "semantic-hit") for r in rs)
    assert embedder.batches - before < 12


async def test_works_with_a_decoding_client(make_cache, policy):
    """The gateway's client may decode responses to str; vectors still round-trip as bytes."""
    a = make_cache(client_kw={"decode_responses": True})
    b = make_cache(client_kw={"decode_responses": True})
    await b.lookup("acme", chat("warm"), policy)
    await a.store("acme", chat("What is an inode?"), answer("a file record"), policy)
    assert (await a.lookup("acme", chat("What is an inode?"), policy)).outcome == "hit"
    assert (await b.lookup("acme", chat("What's an inode?"), policy)).outcome == "semantic-hit"


async def test_in_process_index_keeps_a_bounded_number_of_tenants(make_cache, policy):
    c = make_cache()
    await c.store("t1", chat("What is a mutex?"), answer("a lock"), policy)
    await c.store("t2", chat("What is a semaphore?"), answer("a counter"), policy)
    c._local.max_tenants = 1
    assert (await c.lookup("t1", chat("What's a mutex?"), policy)).outcome == "semantic-hit"
    assert (await c.lookup("t2", chat("What's a semaphore?"), policy)).outcome == "semantic-hit"
    assert len(c._local._tenants) == 1  # t1 was dropped, and is reloaded when needed
    assert (await c.lookup("t1", chat("What's a mutex?"), policy)).outcome == "semantic-hit"


async def test_no_cache_skips_the_lookup_and_still_stores(make_cache, policy):
    """The result says whether the answer may be stored: a miss, or no-cache on a cacheable
    request; never no-store, a hit, or a request that is not deterministic."""
    c = make_cache()
    body = chat("What does a load balancer do?")
    no_cache = CachePolicy(threshold=0.8, no_cache=True)
    skipped = await c.lookup("acme", body, no_cache)
    assert (skipped.outcome, skipped.reason, skipped.storable) == ("bypass", "no-cache", True)
    await c.store("acme", body, answer("spreads load"), no_cache)
    assert (await c.lookup("acme", body, policy)).outcome == "hit"
    assert not (await c.lookup("acme", body, policy)).storable
    both = CachePolicy(no_cache=True, no_store=True)
    assert not (await c.lookup("acme", body, both)).storable
    hot = await c.lookup("acme", chat("What does a load balancer do?", temperature=0.7), no_cache)
    assert (hot.outcome, hot.reason, hot.storable) == ("bypass", "non-deterministic", False)
    miss = await c.lookup("acme", chat("What is a reverse proxy?"), policy)
    assert miss.outcome == "miss" and miss.storable
    assert not (await c.lookup("acme", chat("What is a reverse proxy?"), CachePolicy(no_store=True))).storable


async def test_tiny_temperature_is_greedy_and_shares_the_key(make_cache, policy):
    c = make_cache()
    tiny = chat("Name the largest planet.", temperature=1e-6)
    first = await c.lookup("acme", tiny, policy)
    assert first.outcome == "miss" and first.storable
    await c.store("acme", tiny, answer("Jupiter"), policy)
    assert (await c.lookup("acme", chat("Name the largest planet."), policy)).outcome == "hit"


async def test_developer_and_system_prompts_share_entries(make_cache, policy):
    c = make_cache()
    dev = [{"role": "developer", "content": "Answer in one word."}]
    sys_ = [{"role": "system", "content": "Answer in one word."}]
    await c.store("acme", chat("What colour is the sky?", history=dev), answer("Blue"), policy)
    assert (await c.lookup("acme", chat("What colour is the sky?", history=sys_), policy)).outcome == "hit"
    assert (await c.lookup("acme", chat("What color is the sky?", history=sys_), policy)).outcome == "semantic-hit"


PARAGRAPH = " ".join(
    f"On day {i} the old fishing boat left the harbour at dawn, crossed the bay and came back at dusk."
    for i in range(20))  # ~380 words, well past the 256 word-pieces MiniLM reads


async def test_a_query_too_long_for_the_embedder_gets_the_exact_tier_only(make_cache, policy, embedder):
    """Two long prompts that differ after the embedder's 256 word-pieces embed identically: the
    second must not be served the first's answer, whatever the verifier makes of them."""
    c = make_cache(verifier=Verifier(guards=frozenset()))
    count = chat(PARAGRAPH + " How many times does the word boat appear?")
    colour = chat(PARAGRAPH + " What color is the boat?")
    assert not await embedder.fits(count["messages"][-1]["content"])
    assert float(await embedder.embed(count["messages"][-1]["content"])
                 @ await embedder.embed(colour["messages"][-1]["content"])) > 0.9999
    await c.store("acme", count, answer("20"), policy)
    r = await c.lookup("acme", colour, policy)
    assert (r.outcome, r.reason, r.storable) == ("miss", "too-long", True)
    assert (await c.lookup("acme", count, policy)).outcome == "hit"
    # stored without a vector: a short question finds nothing to compare with
    short = await c.lookup("acme", chat("How many times does the word boat appear?"), policy)
    assert (short.outcome, short.reason) == ("miss", "below-threshold")
    assert await c.store_many("acme", [(colour, answer("unknown"))], policy) == 1
    assert (await c.lookup("acme", colour, policy)).outcome == "hit"
    assert c._local.tenant(c.store_.keys("acme")).size() == 0  # no vector for either


async def test_the_cap_keeps_the_order_of_stores_within_one_millisecond(make_cache, redis_client):
    """Stores in one pipelined round trip share a millisecond: the cap still evicts them in the
    order they were stored (by the time alone, ties went by entry id: a flaky CI find)."""
    from cache.store import NewEntry
    c = make_cache()
    keys = c.store_.keys("acme")
    ids = [f"entry-{letter}" for letter in "zyxwvuts"]  # stored in the reverse of the ids' order
    entries = [NewEntry(entry_id=i, ns="ns", text="", vec=None, response={"i": i}) for i in ids]
    await c.store_.put_many(keys, entries, ttl_s=3600, max_entries=3)
    kept = [m.decode() if isinstance(m, bytes) else m for m in await redis_client.zrange(keys.stored, 0, -1)]
    assert kept == ids[-3:]


async def test_max_age_serves_only_answers_stored_that_recently(make_cache, policy):
    """``Cache-Control: max-age=N``: an answer stored more than N seconds ago (on Redis's clock) is
    a miss, exact or paraphrased, that stores the new answer; without max-age it is still served."""
    import dataclasses

    c = make_cache()
    body = chat("How do I rotate my API key?")
    await c.store("acme", body, answer("Use the rotate button."), policy)
    fresh = dataclasses.replace(policy, max_age_s=60)
    assert (await c.lookup("acme", body, fresh)).outcome == "hit"
    keys = c.store_.keys("acme")
    stored = await c.redis.zrange(keys.stored, 0, -1, withscores=True)
    await c.redis.zadd(keys.stored, {member: score - 120_000 for member, score in stored})  # stored 2 min ago
    for text in ("How do I rotate my API key?", "How can I rotate my API key?"):
        r = await c.lookup("acme", chat(text), fresh)
        assert (r.outcome, r.reason, r.storable) == ("miss", "stale", True), text
    assert (await c.lookup("acme", body, dataclasses.replace(policy, max_age_s=180))).outcome == "hit"
    assert (await c.lookup("acme", body, policy)).outcome == "hit"
    await c.store("acme", body, answer("Rotate it in Settings."), policy)  # the stale miss's new answer
    again = await c.lookup("acme", chat("How can I rotate my API key?"), fresh)
    assert again.outcome == "semantic-hit"
    assert again.response["choices"][0]["message"]["content"] == "Rotate it in Settings."


@pytest.mark.parametrize(("header", "no_cache", "max_age"), [
    ("max-age=60", False, 60), ('max-age="60"', False, 60), ("max-age=0", True, None),
    ("max-age=600, max-age=60", False, 60), ("max-age=abc", False, None), ("max-age=-5", False, None),
    ("max-age=99999999999999999999", False, 2**31), ("max-age=６０", False, None), (None, False, None),
    ("max-age=00000000002", False, 2), ("max-age=00000000000", True, None),  # leading zeros (found by QA)
])
def test_cache_control_max_age_is_read(header, no_cache, max_age):
    from types import SimpleNamespace

    from gateway.cache_glue import cache_policy

    principal = SimpleNamespace(cache_enabled=True, cache_threshold=0.9, cache_ttl_s=3600, cache_max_entries=10)
    got = cache_policy(principal, header)
    assert (got.no_cache, got.max_age_s) == (no_cache, max_age)
