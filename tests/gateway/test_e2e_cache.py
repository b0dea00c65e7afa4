"""The semantic cache wired into the chat route, end to end over HTTP with the real engine:
miss → stored → hit replayed as JSON and as SSE, x-cache headers, Cache-Control (no-cache still
stores a cacheable answer), usage rows with the cache outcome and saved cost, and streams that
never finished are never stored."""

from __future__ import annotations

import json
import socket
import time
from decimal import Decimal

import httpx
import pytest

from gateway import tenancy

pytestmark = pytest.mark.slow


def _h(key: str, **extra: str) -> dict:
    return {"authorization": f"Bearer {key}", **extra}


def _body(api, question: str, **fields) -> dict:  # noqa: ANN001
    body = {"model": api.model, "temperature": 0, "max_tokens": 6,
            "messages": [{"role": "user", "content": question}]}
    body.update(fields)
    return body


def _post(api, key: str, body: dict, **headers: str) -> httpx.Response:  # noqa: ANN001
    return httpx.post(api.base_url + "/v1/chat/completions", json=body, headers=_h(key, **headers), timeout=120)


def _sse(resp: httpx.Response) -> list:
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_miss_then_hit_json_and_sse(api_cached) -> None:  # noqa: ANN001
    api = api_cached

    async def price() -> None:
        async with api.services.db.sessionmaker() as session:
            await tenancy.set_price(session, model=api.model, prompt_usd_per_1m="100", completion_usd_per_1m="300")
            await session.commit()
        api.services.prices.invalidate()

    api.loop.run(price())
    _tid, key = api.make_tenant()
    question = f"What is the capital of France? ({time.time_ns()})"
    first = _post(api, key, _body(api, question))
    assert first.status_code == 200 and first.headers["x-cache"] == "miss"
    answer = first.json()["choices"][0]["message"]["content"]

    hit = _post(api, key, _body(api, question))
    assert hit.status_code == 200
    assert hit.headers["x-cache"] == "hit" and float(hit.headers["x-cache-similarity"]) == pytest.approx(1.0)
    assert hit.json()["choices"][0]["message"]["content"] == answer
    assert hit.json()["id"] != first.json()["id"]
    assert hit.json()["usage"]["completion_tokens"] == first.json()["usage"]["completion_tokens"]

    with httpx.stream("POST", api.base_url + "/v1/chat/completions", headers=_h(key), timeout=120,
                      json=_body(api, question, stream=True, stream_options={"include_usage": True})) as resp:
        assert resp.headers["x-cache"] == "hit" and resp.headers["content-type"].startswith("text/event-stream")
        events = _sse(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == answer
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0

    miss_row = api.usage_rows(first.headers["x-request-id"])[0]
    hit_row = api.usage_rows(hit.headers["x-request-id"])[0]
    assert miss_row.cache == "miss" and Decimal(miss_row.cost_usd) > 0 and Decimal(miss_row.saved_usd) == 0
    assert hit_row.cache == "hit" and Decimal(hit_row.cost_usd) == 0
    assert Decimal(hit_row.saved_usd) == Decimal(miss_row.cost_usd)  # same tokens, same prices
    # a hit's time to first token is the time until its answer was ready (it was NULL)
    assert hit_row.ttft_ms is not None and 0 < hit_row.ttft_ms <= hit_row.latency_ms
    stream_row = api.usage_rows(resp.headers["x-request-id"])[0]
    assert stream_row.cache == "hit" and stream_row.ttft_ms is not None and 0 < stream_row.ttft_ms


def test_cache_control_and_streamed_misses(api_cached) -> None:  # noqa: ANN001
    api = api_cached
    _tid, key = api.make_tenant()
    question = f"Name a primary colour. ({time.time_ns()})"
    # no-store: answered by the engine and not kept
    assert _post(api, key, _body(api, question), **{"cache-control": "no-store"}).headers["x-cache"] == "miss"
    # a streamed miss that completes is stored, and served to a JSON request afterwards
    with httpx.stream("POST", api.base_url + "/v1/chat/completions", headers=_h(key), timeout=120,
                      json=_body(api, question, stream=True)) as resp:
        assert resp.headers["x-cache"] == "miss"
        streamed = "".join(c["choices"][0]["delta"].get("content") or ""
                           for c in _sse(resp)[:-1] if c["choices"])
    again = _post(api, key, _body(api, question))
    assert again.headers["x-cache"] == "hit"
    assert again.json()["choices"][0]["message"]["content"] == streamed
    # non-deterministic requests are not cached
    assert _post(api, key, _body(api, question, temperature=0.9)).headers["x-cache"] == "bypass"


def test_no_cache_skips_the_lookup_and_still_stores(api_cached) -> None:  # noqa: ANN001
    api = api_cached
    _tid, key = api.make_tenant()
    cache = api.app.state.pagegate.cache
    question = f"Name a planet. ({time.time_ns()})"
    first = _post(api, key, _body(api, question), **{"cache-control": "no-cache"})
    assert first.status_code == 200 and first.headers["x-cache"] == "bypass"
    again = _post(api, key, _body(api, question))
    assert again.headers["x-cache"] == "hit"
    assert again.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
    # repeated Cache-Control lines are one list (RFC 9110): the no-cache on the second line counts
    for lines in (["max-age=0", "no-cache"], ["no-cache", "max-age=0"]):
        resp = httpx.post(api.base_url + "/v1/chat/completions", json=_body(api, question), timeout=120,
                          headers=[("authorization", f"Bearer {key}"), *(("cache-control", v) for v in lines)])
        assert resp.status_code == 200 and resp.headers["x-cache"] == "bypass", lines
    # not cacheable (temperature > 0, no seed): no-cache stores nothing
    stores = cache.stats()["stores"]
    hot = _post(api, key, _body(api, f"Name a moon. ({time.time_ns()})", temperature=0.9),
                **{"cache-control": "no-cache"})
    assert hot.status_code == 200 and hot.headers["x-cache"] == "bypass"
    assert cache.stats()["stores"] == stores
    # no-cache and no-store together: neither looked up nor kept
    both = _body(api, f"Name a star. ({time.time_ns()})")
    assert _post(api, key, both, **{"cache-control": "no-cache, no-store"}).headers["x-cache"] == "bypass"
    assert cache.stats()["stores"] == stores
    assert _post(api, key, both).headers["x-cache"] == "miss"


def test_max_age_serves_only_a_recent_answer(api_cached) -> None:  # noqa: ANN001
    """``Cache-Control: max-age=N`` (N > 0): a stored answer older than N seconds is a miss, whose
    new answer is stored; it was ignored before (found by QA)."""
    api = api_cached
    tenant_id, key = api.make_tenant()
    cache = api.app.state.pagegate.cache
    question = f"Name a river. ({time.time_ns()})"
    first = _post(api, key, _body(api, question))
    assert first.headers["x-cache"] == "miss"
    assert _post(api, key, _body(api, question), **{"cache-control": "max-age=3600"}).headers["x-cache"] == "hit"
    namespace = api.loop.run(api.services.auth.authenticate(f"Bearer {key}")).cache_namespace
    assert namespace.startswith(f"{tenant_id}.")
    keys = cache.store_.keys(namespace)

    async def backdate() -> None:
        stored = await cache.redis.zrange(keys.stored, 0, -1, withscores=True)
        await cache.redis.zadd(keys.stored, {m: score - 600_000 for m, score in stored})  # 10 minutes ago

    api.loop.run(backdate())
    stores = cache.stats()["stores"]
    stale = _post(api, key, _body(api, question), **{"cache-control": "max-age=60"})
    assert stale.status_code == 200 and stale.headers["x-cache"] == "miss"
    assert cache.stats()["stores"] == stores + 1  # the new answer replaces the old one
    assert _post(api, key, _body(api, question), **{"cache-control": "max-age=60"}).headers["x-cache"] == "hit"
    # the quoted form, which RFC 9111 5.2 asks recipients to accept (a QA run reported it ignored)
    api.loop.run(backdate())
    assert _post(api, key, _body(api, question), **{"cache-control": 'max-age="60"'}).headers["x-cache"] == "miss"


def test_max_age_zero_and_pragma_skip_the_lookup_and_metrics_count(api_cached) -> None:  # noqa: ANN001
    """``Cache-Control: max-age=0`` (a browser's reload) and, without a Cache-Control line,
    HTTP/1.0's ``Pragma: no-cache`` skip the lookup as ``no-cache`` does; ``/metrics`` shows the
    cache's counters."""
    api = api_cached
    _tid, key = api.make_tenant()
    question = f"Name an ocean. ({time.time_ns()})"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "miss"
    before = httpx.get(api.base_url + "/metrics", timeout=30).json()["cache"]
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "hit"
    for headers in ({"cache-control": "max-age=0"}, {"cache-control": "MAX-AGE = 0"}, {"cache-control": "max-age=00"},
                    {"pragma": "no-cache"}):
        assert _post(api, key, _body(api, question), **headers).headers["x-cache"] == "bypass", headers
    # Cache-Control decides when both are sent; another max-age is not a refusal of stored answers
    for headers in ({"pragma": "no-cache", "cache-control": "no-transform"}, {"cache-control": "max-age=60"},
                    {"pragma": "xno-cachex"}):
        assert _post(api, key, _body(api, question), **headers).headers["x-cache"] == "hit", headers
    after = httpx.get(api.base_url + "/metrics", timeout=30).json()["cache"]
    assert after["hits"] - before["hits"] == 4 and after["bypasses"] - before["bypasses"] == 4
    assert after["lookups"] - before["lookups"] == 8


def test_greedy_temperatures_and_the_developer_role_share_entries(api_cached) -> None:  # noqa: ANN001
    api = api_cached
    _tid, key = api.make_tenant()
    question = f"Name an ocean. ({time.time_ns()})"
    tiny = _post(api, key, _body(api, question, temperature=1e-6))  # greedy in the engine
    assert tiny.status_code == 200 and tiny.headers["x-cache"] == "miss"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "hit"
    rule = f"Answer in one word. ({time.time_ns()})"
    dev = _body(api, question, messages=[{"role": "developer", "content": rule},
                                         {"role": "user", "content": question}])
    assert _post(api, key, dev).headers["x-cache"] == "miss"
    system = dict(dev, messages=[{"role": "system", "content": rule}, {"role": "user", "content": question}])
    assert _post(api, key, system).headers["x-cache"] == "hit"


def test_explicit_defaults_share_the_entry(api_cached) -> None:  # noqa: ANN001
    """Found by QA: a repeat with ``stop_token_ids: []`` or ``tool_choice: "none"`` missed."""
    api = api_cached
    _tid, key = api.make_tenant()
    question = f"Name a river. ({time.time_ns()})"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "miss"
    for default in (dict(stop_token_ids=[]), dict(tool_choice="none"), dict(top_k=0),
                    dict(stop_token_ids=[], tool_choice="none", tools=[], logit_bias={}, stop=[])):
        resp = _post(api, key, _body(api, question, **default))
        assert resp.status_code == 200 and resp.headers["x-cache"] == "hit", default


def test_long_prompts_that_differ_at_the_end_never_share_an_answer(api_cached) -> None:  # noqa: ANN001
    """The cache's embedder reads 256 word-pieces: past that, only the exact tier may answer."""
    api = api_cached
    _tid, key = api.make_tenant()
    paragraph = " ".join(f"On day {i} the old boat left the harbour at dawn and came back at dusk."
                         for i in range(24)) + f" ({time.time_ns()})"
    sad = _body(api, paragraph + " Is the story above sad?")
    funny = _body(api, paragraph + " Is the story above funny?")  # the verifier finds no difference
    assert _post(api, key, sad).headers["x-cache"] == "miss"
    other = _post(api, key, funny)
    assert other.status_code == 200 and other.headers["x-cache"] == "miss"
    assert "x-cache-similarity" not in other.headers
    assert _post(api, key, sad).headers["x-cache"] == "hit"


def test_aborted_stream_is_not_stored_and_tenants_are_isolated(api_cached) -> None:  # noqa: ANN001
    api = api_cached
    _a, key_a = api.make_tenant()
    _b, key_b = api.make_tenant()
    body = _body(api, f"Count slowly to one hundred. ({time.time_ns()})", max_tokens=40, ignore_eos=True)
    with httpx.stream("POST", api.base_url + "/v1/chat/completions", headers=_h(key_a), timeout=120,
                      json=dict(body, stream=True)) as resp:
        assert resp.headers["x-cache"] == "miss"
        for i, _line in enumerate(resp.iter_lines()):
            if i >= 2:
                break  # leave before the end: this partial answer must never be stored
    time.sleep(0.3)
    assert _post(api, key_a, body).headers["x-cache"] == "miss"
    # tenant B never sees tenant A's entry, even for the identical request
    short = _body(api, f"Say yes. ({time.time_ns()})", max_tokens=2)
    assert _post(api, key_a, short).headers["x-cache"] == "miss"
    assert _post(api, key_b, short).headers["x-cache"] == "miss"
    assert _post(api, key_a, short).headers["x-cache"] == "hit"


def test_a_semantic_hit_reports_its_own_prompt_tokens(api_cached) -> None:  # noqa: ANN001
    """A paraphrase served from the cache is billed nothing, but its usage counts its own prompt
    (not the stored request's), as the engine would have seen it."""
    api = api_cached
    _tid, key = api.make_tenant()
    first = _post(api, key, _body(api, "How do I reset my password?"))
    assert first.status_code == 200 and first.headers["x-cache"] == "miss"
    question = "What are the steps to reset my password?"
    hit = _post(api, key, _body(api, question))
    assert hit.headers["x-cache"] == "semantic-hit", hit.headers
    own = len(api.app.state.pagegate.engine.encode_chat([{"role": "user", "content": question}]))
    assert own != first.json()["usage"]["prompt_tokens"]  # the two prompts differ in length
    assert hit.json()["usage"]["prompt_tokens"] == own
    assert hit.json()["usage"]["completion_tokens"] == first.json()["usage"]["completion_tokens"]
    row = api.usage_rows(hit.headers["x-request-id"])[0]
    assert row.cache == "semantic-hit" and row.prompt_tokens == own and Decimal(row.cost_usd) == 0


def test_a_tenant_id_used_again_never_reads_the_old_tenants_answers(api_cached) -> None:  # noqa: ANN001
    """Found by QA: the cache's namespace was the tenant's id alone, so after a database reset (or a
    restore, or staging and production on one Redis) a new tenant that got an old tenant's id was
    served that tenant's stored answers. The namespace now holds the tenant's creation time too:
    here the tenant row is given another creation time, as a new tenant with the same id would have."""
    from datetime import UTC, datetime

    from sqlalchemy import update

    from gateway.db.models import Tenant

    api = api_cached
    tenant_id, key = api.make_tenant()
    question = f"What is the secret plan of project {time.time_ns()}?"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "miss"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "hit"

    async def recreate() -> None:
        async with api.services.db.sessionmaker() as s:
            await s.execute(update(Tenant).where(Tenant.id == tenant_id)
                            .values(created_at=datetime(2020, 1, 1, tzinfo=UTC)))
            await s.commit()
        await api.services.auth.invalidate_tenant(tenant_id)

    api.loop.run(recreate())
    again = _post(api, key, _body(api, question))
    assert again.status_code == 200 and again.headers["x-cache"] == "miss"


@pytest.mark.parametrize("stored", [b"[]", b'{"choices": "x"}', b"{not json", b'{"choices": [{"index": 0}]}',
                                    b'{"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],'
                                    b' "usage": {"prompt_tokens": "many"}}',
                                    b'{"choices": [{"index": 0, "finish_reason": "stop", "message": ["hi"], "text": "x"}]}'])
def test_an_unreadable_stored_answer_is_a_miss_and_is_replaced(api_cached, stored) -> None:  # noqa: ANN001
    """Found by QA: an entry whose stored answer was JSON of another shape (another version sharing
    Redis, a hand edit) gave a 500 with a traceback; one that was not JSON was a bypass for as long
    as it lived. Either is now a miss, answered by the engine, whose answer replaces it."""
    api = api_cached
    _tid, key = api.make_tenant()
    cache = api.app.state.pagegate.cache
    question = f"Name a mountain. ({time.time_ns()})"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "miss"
    namespace = api.loop.run(api.services.auth.authenticate(f"Bearer {key}")).cache_namespace
    keys = cache.store_.keys(namespace)

    async def corrupt() -> int:
        entries = [k async for k in cache.redis.scan_iter(match=keys.entry_prefix + "*")]
        for k in entries:
            await cache.redis.hset(k, "resp", stored)
        return len(entries)

    assert api.loop.run(corrupt()) == 1
    again = _post(api, key, _body(api, question))
    assert again.status_code == 200 and again.headers["x-cache"] == "miss", again.text
    assert again.json()["choices"][0]["message"]["content"]
    healed = _post(api, key, _body(api, question))
    assert healed.headers["x-cache"] == "hit" and healed.json()["choices"] == again.json()["choices"]


def test_an_admin_clear_makes_the_next_request_a_miss(api_cached) -> None:  # noqa: ANN001
    """``Management.clear_cache`` (the admin API's and CLI's clear-cache) on a serving gateway: the
    exact repeat and a paraphrase that hit before are answered by the engine after it, and stored
    again (the in-process vector index forgets what Redis no longer holds)."""
    from admin.management import Management

    api = api_cached
    _tid, key = api.make_tenant()
    tag = time.time_ns()
    question = f"What is the tallest building in Dubai? ({tag})"
    paraphrase = f"What's the tallest building in Dubai? ({tag})"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "miss"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "hit"
    assert _post(api, key, _body(api, paraphrase)).headers["x-cache"] == "semantic-hit"
    name = api.loop.run(api.services.auth.authenticate(f"Bearer {key}")).tenant_name

    async def clear() -> int:
        async with api.services.db.sessionmaker() as s:
            ops = Management(session=s, actor="test", redis=api.services.redis,
                             redis_prefix=api.services.settings.redis_prefix)
            _tenant, answers, keys = await ops.clear_cache(name)
            assert keys >= 3  # (the answer, and the tenant's index keys)
            return answers

    assert api.loop.run(clear()) == 1
    # (each miss stores its new answer, which the other text would then find: one text per clear)
    assert _post(api, key, _body(api, paraphrase)).headers["x-cache"] == "miss"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "semantic-hit"  # the new answer
    assert api.loop.run(clear()) == 1
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "miss"
    assert _post(api, key, _body(api, question)).headers["x-cache"] == "hit"


def test_an_answer_finished_after_its_tenant_was_deleted_is_not_stored(api_cached) -> None:  # noqa: ANN001
    """Found by a review: a request running while its tenant was deleted stored its answer after
    the delete's purge, for the entries' whole TTL. The chat route's store asks first whether the
    key still authenticates (``Authenticator.still_valid``): here the same store, made for a
    request of a live tenant, is run once before and once after the tenant's delete."""
    from admin.management import Management
    from gateway.cache_glue import cache_body, cache_store
    from gateway.schemas import ChatCompletionRequest

    api = api_cached
    cache = api.app.state.pagegate.cache
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Lake Baikal."},
                           "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}

    def store_for(key: str, question: str):  # noqa: ANN202
        principal = api.loop.run(api.services.auth.authenticate(f"Bearer {key}"))
        body = cache_body(ChatCompletionRequest.model_validate(_body(api, question)))
        store = cache_store(cache, principal.cache_namespace, body, cache.defaults,
                            still_valid=lambda: api.services.auth.still_valid(principal))
        return principal, store

    async def delete(name: str) -> None:
        async with api.services.db.sessionmaker() as s:
            await Management(session=s, actor="test", redis=api.services.redis,
                             redis_prefix=api.services.settings.redis_prefix).delete_tenant(name)

    for deleted in (False, True):
        _tid, key = api.make_tenant()
        principal, store = store_for(key, f"Name a lake. ({time.time_ns()})")
        if deleted:
            api.loop.run(delete(principal.tenant_name))
        api.loop.run(store(answer))
        stored = api.loop.run(cache.store_.count(cache.store_.keys(principal.cache_namespace)))
        assert stored == (0 if deleted else 1), deleted


def test_identical_requests_at_once_run_on_the_engine_once(api_cached) -> None:  # noqa: ANN001
    """Six identical deterministic JSON requests at once (official ``openai`` client): the first
    runs on the engine, the other five wait for its answer and are served it as hits, billed
    nothing (``gateway.flights``); a stream of the same request afterwards is a stored hit."""
    import asyncio

    api = api_cached
    _tid, key = api.make_tenant()
    question = f"Name three colours of the rainbow. ({time.time_ns()})"

    async def ask_all() -> list:
        client = api.async_openai(key)
        try:
            return await asyncio.gather(*(client.chat.completions.with_raw_response.create(
                model=api.model, temperature=0, max_tokens=32, messages=[{"role": "user", "content": question}])
                for _ in range(6)))
        finally:
            await client.close()

    coalesced = api.app.state.pagegate.flights.coalesced
    raws = asyncio.run(ask_all())
    assert api.app.state.pagegate.flights.coalesced == coalesced + 5
    with httpx.stream("POST", api.base_url + "/v1/chat/completions", headers=_h(key), timeout=120,
                      json=_body(api, question, max_tokens=32, stream=True)) as resp:
        assert resp.headers["x-cache"] == "hit" and "x-cache-coalesced" not in resp.headers  # stored by now
    metrics = httpx.get(api.base_url + "/metrics", timeout=30).json()
    assert metrics["cache"]["coalesced"] >= 5
    outcomes = sorted((r.headers["x-cache"], r.headers.get("x-cache-coalesced"), r.headers.get("x-cache-similarity"))
                      for r in raws)
    assert outcomes == [("hit", "true", "1.0000")] * 5 + [("miss", None, None)], outcomes
    answers = {r.parse().choices[0].message.content for r in raws}
    assert len(answers) == 1 and answers != {""}
    rows = [api.usage_rows(r.headers["x-request-id"])[0] for r in raws]
    assert sorted(row.cache for row in rows) == ["hit"] * 5 + ["miss"]
    assert all(row.status == "ok" for row in rows)
    assert len({row.completion_tokens for row in rows}) == 1  # each row counts the answer it was given
    assert all(Decimal(row.cost_usd) == 0 for row in rows if row.cache == "hit")


def test_followers_of_a_leader_that_ends_without_an_answer_run_themselves(api_cached) -> None:  # noqa: ANN001
    """A leader whose client leaves lands no answer: the requests that waited for it run on the
    engine themselves (misses), and none waits for ever."""
    import asyncio

    api = api_cached
    _tid, key = api.make_tenant()
    body = _body(api, f"Tell me a long story about a lighthouse. ({time.time_ns()})", max_tokens=120, min_tokens=120)

    async def scenario() -> list:
        async with httpx.AsyncClient(base_url=api.base_url, timeout=120) as client:
            async def leader() -> None:
                with pytest.raises(httpx.TimeoutException):  # the leader's client gives up and leaves
                    await client.post("/v1/chat/completions", json=body, headers=_h(key), timeout=0.8)

            lead = asyncio.ensure_future(leader())
            await asyncio.sleep(0.3)  # its lookup done: it leads
            followers = [client.post("/v1/chat/completions", json=body, headers=_h(key)) for _ in range(2)]
            # a stream neither leads nor follows: it runs at once, its own miss
            streamed = client.post("/v1/chat/completions", json={**body, "stream": True}, headers=_h(key))
            done = await asyncio.gather(lead, *followers, streamed)
            assert done[-1].status_code == 200 and done[-1].headers["x-cache"] == "miss"
            assert "x-cache-coalesced" not in done[-1].headers
            return done[1:-1]

    flights = api.app.state.pagegate.flights
    fallbacks, coalesced = flights.coalesce_fallbacks, flights.coalesced
    followers = asyncio.run(scenario())
    # both waited for the leader; then one led in its place and the other followed it
    assert flights.coalesce_fallbacks == fallbacks + 1 and flights.coalesced == coalesced + 1
    assert len(flights) == 0
    assert sorted(r.headers["x-cache"] for r in followers) == ["hit", "miss"]
    for resp in followers:
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 120


def test_a_replayed_stream_cut_short_is_recorded_aborted_with_the_tokens_it_reached(api_cached) -> None:  # noqa: ANN001
    """Found by QA: a cached answer replayed as a stream whose client left early was recorded
    ``ok`` with the whole answer's tokens (and savings); it is now ``aborted`` with the share of
    the tokens its text reached, as a stream the engine ran is."""
    api = api_cached
    _tid, key = api.make_tenant()
    cache = api.app.state.pagegate.cache
    body = _body(api, f"Recite a list of words. ({time.time_ns()})")
    assert _post(api, key, body).headers["x-cache"] == "miss"
    namespace = api.loop.run(api.services.auth.authenticate(f"Bearer {key}")).cache_namespace
    keys = cache.store_.keys(namespace)
    words = 30_000  # ~7.5 MB of events: more than the sockets hold when the client leaves
    long = {"choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": " word" * words}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": words, "total_tokens": words + 20}}

    async def lengthen() -> int:
        entries = [k async for k in cache.redis.scan_iter(match=keys.entry_prefix + "*")]
        for k in entries:
            await cache.redis.hset(k, "resp", json.dumps(long))
        return len(entries)

    assert api.loop.run(lengthen()) == 1
    # a small receive buffer, as a slow client's: else the loopback's autotuned buffers (32 MB
    # here) take the whole replay before the client leaves
    small = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)])
    with httpx.Client(transport=small, timeout=120) as client, client.stream(
            "POST", api.base_url + "/v1/chat/completions", headers=_h(key), json=dict(body, stream=True)) as resp:
        assert resp.headers["x-cache"] == "hit"
        request_id = resp.headers["x-request-id"]
        for i, _line in enumerate(resp.iter_lines()):
            if i >= 20:
                break
    for _ in range(100):
        rows = api.usage_rows(request_id)
        if rows:
            break
        time.sleep(0.1)
    row = rows[0]
    assert row.cache == "hit" and row.status == "aborted", (row.status, row.completion_tokens, row.latency_ms)
    assert 0 < row.completion_tokens < words
    # read to the end, the same replay is recorded whole
    whole = _post(api, key, dict(body, stream=True))
    row = api.usage_rows(whole.headers["x-request-id"])[0]
    assert (row.status, row.completion_tokens, row.finish_reason) == ("ok", words, "length")


def test_a_tool_call_is_replayed_exactly_and_never_by_paraphrase(api_cached) -> None:  # noqa: ANN001
    """A deterministic request whose tools may be called is cached in the exact tier: the repeat is
    a hit showing the same calls (new ids), whole and streamed; a paraphrase is a miss (it may
    need other arguments), and so is the request with other tools."""
    api = api_cached
    _tid, key = api.make_tenant()
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
    question = f"What is the weather in Paris? ({time.time_ns()})"
    body = _body(api, question, max_tokens=40, tools=[weather], tool_choice="required")
    first = _post(api, key, body)
    assert first.status_code == 200 and first.headers["x-cache"] == "miss"
    calls = first.json()["choices"][0]["message"]["tool_calls"]
    assert first.json()["choices"][0]["finish_reason"] == "tool_calls" and calls
    again = _post(api, key, body)
    assert again.headers["x-cache"] == "hit"
    replayed = again.json()["choices"][0]
    assert replayed["finish_reason"] == "tool_calls" and replayed["message"]["content"] is None
    assert [c["function"] for c in replayed["message"]["tool_calls"]] == [c["function"] for c in calls]
    assert {c["id"] for c in replayed["message"]["tool_calls"]}.isdisjoint(c["id"] for c in calls)
    streamed = _post(api, key, dict(body, stream=True))
    assert streamed.headers["x-cache"] == "hit"
    pieces: dict[int, dict] = {}
    for chunk in _sse(streamed)[:-1]:
        for piece in chunk["choices"][0]["delta"].get("tool_calls", []) if chunk["choices"] else []:
            entry = pieces.setdefault(piece["index"], {"name": piece["function"].get("name"), "arguments": ""})
            entry["arguments"] += piece["function"]["arguments"]
    assert [pieces[i] for i in sorted(pieces)] == [c["function"] for c in calls]
    paraphrase = _body(api, question.replace("What is the weather in", "How is the weather in"), max_tokens=40,
                       tools=[weather], tool_choice="required")
    assert _post(api, key, paraphrase).headers["x-cache"] == "miss"
    other = dict(body, tools=[weather, {"type": "function", "function": {"name": "get_time"}}])
    assert _post(api, key, other).headers["x-cache"] == "miss"


def test_a_question_in_shorthand_and_framing_is_served_over_http(api_cached) -> None:  # noqa: ANN001
    """Official ``openai`` client, the gateway's default threshold (0.90): a question asked in short
    and wrapped in a request is served the stored answer (cache/shorthand.py); the same shorthand
    asking about another number is not. Embedded and guarded as typed, the first was a miss."""
    api = api_cached
    _tid, key = api.make_tenant()
    client = api.openai(key)
    kwargs = dict(model=api.model, temperature=0, max_tokens=6)
    stored = client.chat.completions.with_raw_response.create(
        messages=[{"role": "user", "content": "What is the square root of 144?"}], **kwargs)
    assert stored.headers["x-cache"] == "miss"
    asked = client.chat.completions.with_raw_response.create(
        messages=[{"role": "user", "content": "Hey, quick question: sqrt of 144? Thanks!"}], **kwargs)
    assert asked.headers["x-cache"] == "semantic-hit", asked.headers
    assert asked.parse().choices[0].message.content == stored.parse().choices[0].message.content
    other = client.chat.completions.with_raw_response.create(
        messages=[{"role": "user", "content": "Hey, quick question: sqrt of 169? Thanks!"}], **kwargs)
    assert other.headers["x-cache"] == "miss", other.headers
