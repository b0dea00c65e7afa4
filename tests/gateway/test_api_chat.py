"""Chat and text completions against the real engine (SmolLM2-135M) over HTTP: the SSE wire
format, usage and prefix-cache accounting, sampling fields, tenant salt, client disconnects."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import httpx
import pytest

from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

# Long enough for several full KV blocks (block_size 16) so the prefix cache has something to hold.
SYSTEM = ("You are a terse assistant for the pagegate test-suite. Answer in one short sentence, "
          "never more than ten words, and do not use lists or markdown formatting of any kind.")


def headers(api, key: str | None = None) -> dict:  # noqa: ANN001
    return {"authorization": f"Bearer {key or api.key}"}


def chat_body(api, content: str = "Name a colour.", **fields) -> dict:  # noqa: ANN001
    body = {"model": api.model, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]}
    body.update(fields)
    return body


def read_sse(resp: httpx.Response) -> list:
    """The ``data:`` payloads of a stream, parsed (``[DONE]`` kept as the string)."""
    events = []
    for line in resp.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_chat_stream_wire_format(api) -> None:  # noqa: ANN001
    body = chat_body(api, stream=True, stream_options={"include_usage": True}, max_tokens=5, ignore_eos=True)
    with httpx.stream("POST", api.base_url + "/v1/chat/completions", json=body, headers=headers(api),
                      timeout=120) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-request-id"].startswith("req_")
        assert "x-ratelimit-remaining-requests" in resp.headers
        events = read_sse(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content_chunks and all(c["usage"] is None for c in chunks[:-1])
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["choices"][0]["finish_reason"] == "length"
    last = chunks[-1]
    assert last["choices"] == []
    usage = last["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 0


def test_stream_without_usage_has_no_usage_chunk(api) -> None:  # noqa: ANN001
    with httpx.stream("POST", api.base_url + "/v1/completions", headers=headers(api), timeout=120,
                      json={"model": api.model, "prompt": "The sky is", "max_tokens": 3, "stream": True,
                            "temperature": 0, "ignore_eos": True}) as resp:
        events = read_sse(resp)
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "text_completion" and e["choices"] for e in events[:-1])
    assert "".join(e["choices"][0]["text"] for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_usage_row_prefix_cache_and_cost(api) -> None:  # noqa: ANN001
    from gateway import tenancy

    async def set_price() -> None:
        async with api.services.db.sessionmaker() as session:
            await tenancy.set_price(session, model=api.model, prompt_usd_per_1m="1000", completion_usd_per_1m="2000",
                                    cached_prompt_usd_per_1m="100")
            await session.commit()
        api.services.prices.invalidate()

    api.loop.run(set_price())
    try:
        tenant_id, key = api.make_tenant(budget_usd="1000")
        question = f"Is {time.time_ns()} an even number?"  # unseen prompt: only the system prefix can be cached
        first = httpx.post(api.base_url + "/v1/chat/completions", json=chat_body(api, question),
                           headers=headers(api, key), timeout=120)
        second = httpx.post(api.base_url + "/v1/chat/completions", json=chat_body(api, question),
                            headers=headers(api, key), timeout=120)
        assert first.status_code == second.status_code == 200
        u1, u2 = first.json()["usage"], second.json()["usage"]
        assert u1["prompt_tokens"] == u2["prompt_tokens"] > 32
        assert u2["prompt_tokens_details"]["cached_tokens"] >= 32  # whole blocks of the first request
        assert u2["prompt_tokens_details"]["cached_tokens"] > u1["prompt_tokens_details"]["cached_tokens"]
        # greedy decoding: the same answer twice
        assert first.json()["choices"][0]["message"] == second.json()["choices"][0]["message"]
        # as OpenAI's schema has it (required there: a QA find)
        assert {k: v for k, v in first.json()["choices"][0]["message"].items() if k != "content"} == {
            "role": "assistant", "refusal": None, "annotations": []}

        rows = api.usage_rows(second.headers["x-request-id"])
        assert len(rows) == 1
        row = rows[0]
        assert row.tenant_id == tenant_id and row.model == api.model and row.endpoint == "chat.completions"
        assert row.status == "ok" and row.cache == "bypass"  # (this gateway runs without the cache: not looked up)
        assert row.prompt_tokens == u2["prompt_tokens"]
        assert row.cached_prompt_tokens == u2["prompt_tokens_details"]["cached_tokens"]
        assert row.completion_tokens == u2["completion_tokens"]
        cached = u2["prompt_tokens_details"]["cached_tokens"]  # at the model's cached-prompt price
        expected = (Decimal(1000) * (u2["prompt_tokens"] - cached) + Decimal(100) * cached
                    + Decimal(2000) * u2["completion_tokens"]) / Decimal(10**6)
        assert Decimal(row.cost_usd) == expected
        assert row.latency_ms > 0 and row.ttft_ms is not None and 0 < row.ttft_ms <= row.latency_ms
        # the budget is charged what the rows bill
        api.settle_pending()
        both = api.usage_rows(first.headers["x-request-id"]) + rows
        tokens, usd = api.loop.run(api.services.quota.usage(tenant_id))
        assert usd == sum(Decimal(r.cost_usd) for r in both) and usd < Decimal(3000) * tokens / 10**6
    finally:
        async def drop_price() -> None:
            async with api.services.db.sessionmaker() as session:
                await tenancy.set_price(session, model=api.model, prompt_usd_per_1m="0", completion_usd_per_1m="0")
                await session.commit()
            api.services.prices.invalidate()

        api.loop.run(drop_price())


def test_tenants_never_share_prefix_blocks(api) -> None:  # noqa: ANN001
    question = f"Spell the number {time.time_ns()}."
    _a, key_a = api.make_tenant()
    _b, key_b = api.make_tenant()
    warm = httpx.post(api.base_url + "/v1/chat/completions", json=chat_body(api, question), headers=headers(api, key_a),
                      timeout=120)
    assert warm.status_code == 200
    other = httpx.post(api.base_url + "/v1/chat/completions", json=chat_body(api, question), headers=headers(api, key_b),
                       timeout=120).json()
    again = httpx.post(api.base_url + "/v1/chat/completions", json=chat_body(api, question), headers=headers(api, key_a),
                       timeout=120).json()
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # B's first sight of the prompt
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_sampling_fields_reach_the_engine(api, api_engine) -> None:  # noqa: ANN001
    url, h = api.base_url + "/v1/chat/completions", headers(api)
    # seed: reproducible sampling at temperature 1
    body = chat_body(api, "Invent a word.", temperature=1.0, seed=1234, max_tokens=6)
    texts = {httpx.post(url, json=body, headers=h, timeout=120).json()["choices"][0]["message"]["content"]
             for _ in range(2)}
    assert len(texts) == 1
    # max_tokens / ignore_eos: exactly max_tokens, finish_reason length
    r = httpx.post(url, json=chat_body(api, max_tokens=3, ignore_eos=True), headers=h, timeout=120).json()
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "length"
    # max_completion_tokens wins over max_tokens
    r = httpx.post(url, json=chat_body(api, max_tokens=9, max_completion_tokens=2, ignore_eos=True), headers=h,
                   timeout=120).json()
    assert r["usage"]["completion_tokens"] == 2
    # stop strings are never emitted
    r = httpx.post(url, json=chat_body(api, "Write a sentence about cats.", max_tokens=12, stop=[" "]), headers=h,
                   timeout=120).json()
    text = r["choices"][0]["message"]["content"]
    assert " " not in text
    assert r["choices"][0]["finish_reason"] in ("stop", "length")
    # n > 1: independent choices with their own indexes; usage counts all of them
    r = httpx.post(url, json=chat_body(api, n=2, temperature=1.0, max_tokens=3, ignore_eos=True), headers=h,
                   timeout=120).json()
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert r["usage"]["completion_tokens"] == 6
    # min_tokens: no end of sequence before it
    r = httpx.post(url, json=chat_body(api, max_tokens=4, min_tokens=4), headers=h, timeout=120).json()
    assert r["usage"]["completion_tokens"] == 4
    # presence / frequency penalties: accepted, passed to the engine as sent (the gateway's answer
    # equals the engine's own for the same SamplingParams), and they change a greedy answer
    prompt = "cat cat cat cat cat cat cat cat"

    def greedy(**penalties: float) -> str:
        body = {"model": api.model, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                **penalties}
        resp = httpx.post(api.base_url + "/v1/completions", json=body, headers=h, timeout=120)
        assert resp.status_code == 200, resp.text
        return resp.json()["choices"][0]["text"]

    async def engine_text(**penalties: float) -> str:
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **penalties)
        text = ""
        async for out in api_engine.generate(prompt, params, request_id=f"direct-{time.time_ns()}"):
            text += "".join(d.text for d in out.deltas)
        return text

    plain = greedy()
    assert greedy(presence_penalty=0.0, frequency_penalty=0.0) == plain  # zero penalties: no-ops
    for penalties in (dict(presence_penalty=2.0), dict(presence_penalty=-0.5, frequency_penalty=1.5)):
        penalized = greedy(**penalties)
        assert penalized != plain, penalties
        assert penalized == api.loop.run(engine_text(**penalties)), penalties


def test_text_completion_echo_and_token_prompt(api) -> None:  # noqa: ANN001
    url, h = api.base_url + "/v1/completions", headers(api)
    r = httpx.post(url, json={"model": api.model, "prompt": "Once upon a time", "max_tokens": 3, "echo": True,
                              "temperature": 0, "ignore_eos": True}, headers=h, timeout=120).json()
    assert r["object"] == "text_completion"
    assert r["choices"][0]["text"].startswith("Once upon a time")
    ids = httpx.post(url, json={"model": api.model, "prompt": [1, 2, 3, 4], "max_tokens": 2, "ignore_eos": True},
                     headers=h, timeout=120).json()
    assert ids["usage"]["prompt_tokens"] == 4 and ids["usage"]["completion_tokens"] == 2


def test_client_disconnect_aborts_the_engine_request(api, api_engine) -> None:  # noqa: ANN001
    body = chat_body(api, "Count from one to one thousand.", stream=True, max_tokens=400, ignore_eos=True)
    with httpx.stream("POST", api.base_url + "/v1/chat/completions", json=body, headers=headers(api),
                      timeout=120) as resp:
        request_id = resp.headers["x-request-id"]
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen >= 3:
                break  # leave mid-stream: the connection is closed on exiting the block
    deadline = time.monotonic() + 30
    rows = []
    while time.monotonic() < deadline:
        rows = api.usage_rows(request_id)
        if rows:
            break
        time.sleep(0.1)
    assert rows, "no usage row for the aborted stream"
    assert rows[0].status == "aborted"
    assert rows[0].completion_tokens < 400
    # the engine dropped the request: nothing of it is left in the engine
    while time.monotonic() < deadline and request_id in api_engine.engine.requests:
        time.sleep(0.05)
    assert request_id not in api_engine.engine.requests


def test_non_streaming_disconnect_aborts_too(api, api_engine) -> None:  # noqa: ANN001
    body = chat_body(api, "Count from one to one thousand.", max_tokens=400, ignore_eos=True)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(api.base_url + "/v1/chat/completions", json=body, headers=headers(api), timeout=1.5)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (api_engine.engine.has_unfinished_requests()):
        time.sleep(0.05)
    assert not api_engine.engine.has_unfinished_requests()
    rows = [r for r in api.usage_rows() if r.status == "aborted" and r.endpoint == "chat.completions"]
    assert any(r.completion_tokens < 400 for r in rows)


def test_overloaded_engine_is_503_with_retry_after(api, api_engine) -> None:  # noqa: ANN001
    import openai

    saved = api_engine.config.max_waiting, api_engine.config.max_num_seqs
    api_engine.config.max_waiting = 0  # the engine's own admission check now refuses everything
    api_engine.config.max_num_seqs = 0  # (no free running slot either: one would take the request at once)
    try:
        with pytest.raises(openai.InternalServerError) as err:
            api.openai().chat.completions.create(model=api.model, max_tokens=1,
                                                 messages=[{"role": "user", "content": "Hi"}])
    finally:
        api_engine.config.max_waiting, api_engine.config.max_num_seqs = saved
    assert err.value.status_code == 503 and err.value.code == "overloaded"
    assert int(err.value.response.headers["retry-after"]) >= 1
    assert int(err.value.response.headers["retry-after-ms"]) >= 1000  # as the 429s (a QA find)
    rows = api.usage_rows(err.value.response.headers["x-request-id"])
    assert len(rows) == 1 and rows[0].status == "error" and rows[0].completion_tokens == 0
    # the engine never took it: nothing charged (it used to bill and count the prompt's tokens)
    assert rows[0].prompt_tokens == 0 and rows[0].cost_usd == 0


def test_a_tenant_whose_share_of_the_queue_is_full_gets_429(api, api_engine) -> None:  # noqa: ANN001
    """Found by QA: one tenant's batches filled the engine's whole waiting queue and every other
    tenant got 503. Past its share (``PAGEGATE_MAX_WAITING_PER_TENANT``) a tenant gets 429 and
    retries; the server is not overloaded for the others."""
    import openai

    saved = api_engine._class_cap
    api_engine._class_cap = 0  # this tenant's share is full whatever it holds
    try:
        with pytest.raises(openai.RateLimitError) as err:
            api.openai().chat.completions.create(model=api.model, max_tokens=1,
                                                 messages=[{"role": "user", "content": "Hi"}])
    finally:
        api_engine._class_cap = saved
    assert err.value.status_code == 429 and err.value.code == "rate_limit_exceeded"
    assert "waiting for the engine" in err.value.message
    assert int(err.value.response.headers["retry-after"]) >= 1
    assert int(err.value.response.headers["retry-after-ms"]) >= 1000  # as the 429s (a QA find)
    rows = api.usage_rows(err.value.response.headers["x-request-id"])
    assert len(rows) == 1 and rows[0].status == "error" and rows[0].cost_usd == 0


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_while_its_request_is_queued_aborts_it_at_once(api, api_engine, stream) -> None:  # noqa: ANN001
    """The engine is held inside a step; a second request waits in its queue, and its client
    gives up. The request is aborted and recorded then, not once the engine gets to it (it used to
    be prefilled and sampled first, 20 s later under load), and costs nothing."""
    import threading

    gate = threading.Event()
    step = api_engine.engine.step
    entered = threading.Event()

    def held_step():  # noqa: ANN202
        entered.set()
        gate.wait(30)
        return step()

    api_engine.engine.step = held_step
    first = threading.Thread(target=lambda: httpx.post(
        api.base_url + "/v1/chat/completions", json=chat_body(api, "Hi", max_tokens=1), headers=headers(api),
        timeout=60))
    try:
        first.start()
        assert entered.wait(30)  # the engine is inside a step now, holding everything else back
        body = chat_body(api, "Count to ten.", stream=stream, max_tokens=50)
        with pytest.raises(httpx.ReadTimeout):
            if stream:
                with httpx.stream("POST", api.base_url + "/v1/chat/completions", json=body, headers=headers(api),
                                  timeout=1.0) as resp:
                    resp.read()
            else:
                httpx.post(api.base_url + "/v1/chat/completions", json=body, headers=headers(api), timeout=1.0)
        deadline = time.monotonic() + 10
        rows = []
        while time.monotonic() < deadline and not rows:
            rows = [r for r in api.usage_rows() if r.status == "aborted" and r.completion_tokens == 0
                    and r.ttft_ms is None and r.latency_ms < 5000 and r.prompt_tokens == 0 and r.cost_usd == 0]
            time.sleep(0.1)
        # and billed nothing: the engine never computed its prompt (found by QA: it was billed the prompt)
        assert rows, "the queued request was not aborted (and billed nothing) while the engine was busy"
        assert not gate.is_set()  # (all of this while the engine was still held)
    finally:
        gate.set()
        api_engine.engine.step = step
        first.join(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and api_engine.engine.has_unfinished_requests():
        time.sleep(0.05)
    assert not api_engine.engine.has_unfinished_requests()


def test_generation_requests_announce_themselves_and_no_notice_outlives_its_request(api, api_engine,  # noqa: ANN001
                                                                                    monkeypatch) -> None:
    """Each /v1 generation request with a valid key announces itself to the engine (the idle engine
    waits for announced requests instead of a gap of silence); whatever the outcome (answered,
    streamed, refused by validation, by the model check, by the quota, or left by its client), its
    notice is consumed or closed, not left for the garbage collector's safety net."""
    import openai

    from engine.arrivals import ArrivalNotice

    dropped_open: list[ArrivalNotice] = []

    def record_drop(self):  # noqa: ANN001, ANN202
        if self.open:
            dropped_open.append(self)
            self.close()

    monkeypatch.setattr(ArrivalNotice, "__del__", record_drop)
    gate = api_engine._burst
    issued = gate._issued
    client = api.openai()
    client.chat.completions.create(**chat_body(api, max_tokens=2))
    for _ in client.chat.completions.create(**chat_body(api, max_tokens=2, stream=True)):
        pass
    client.completions.create(model=api.model, prompt="Once upon", max_tokens=2)
    with pytest.raises(openai.BadRequestError):  # context length
        client.chat.completions.create(**chat_body(api, max_tokens=10**6))
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(**chat_body(api, model="no-such-model"))
    _, poor = api.make_tenant(budget_tokens=1, tpm=0)
    with pytest.raises(openai.RateLimitError):
        api.openai(poor).chat.completions.create(**chat_body(api))
    with httpx.stream("POST", api.base_url + "/v1/chat/completions", headers=headers(api), timeout=120,
                      json=chat_body(api, "Count to one thousand.", stream=True, max_tokens=300, ignore_eos=True)) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"content":"' in line:
                break  # leave mid-stream
    with pytest.raises(openai.AuthenticationError):  # no valid key: never announced
        api.openai("pg-" + "x" * 43).chat.completions.create(**chat_body(api))
    client.models.list()  # not a generation: no notice
    httpx.post(api.base_url + "/v1/embeddings", headers=headers(api), timeout=120,
               json={"model": "all-minilm-l6-v2", "input": "hi"})
    assert gate._issued - issued == 7
    deadline = time.monotonic() + 30
    while gate.open_notices and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gate.open_notices == 0 and not dropped_open


def test_a_tenant_holding_every_running_slot_gives_one_to_another(api, api_engine) -> None:  # noqa: ANN001
    """Found by QA: one tenant's long answers held every running slot (``max_num_seqs``) and another
    tenant's request waited for one of them to end. Now the holder's newest sequence yields its slot
    at once and is recomputed later; both of its streams still end with every token asked for."""
    sched = api_engine.engine.scheduler
    saved, yields = sched.max_num_seqs, sched.num_yields
    sched.max_num_seqs = 2  # read by the step thread at each step
    _tid, other_key = api.make_tenant()
    client = api.openai()
    try:
        streams = [client.chat.completions.create(
            model=api.model, stream=True, max_tokens=150, temperature=0, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": f"Tell story number {i}."}], extra_body={"ignore_eos": True})
            for i in (1, 2)]
        for s in streams:  # the role chunk, then a first token: both hold a running slot
            next(iter(s))
            next(iter(s))
        other = api.openai(other_key).chat.completions.create(
            model=api.model, max_tokens=2, messages=[{"role": "user", "content": "Hi"}],
            extra_body={"ignore_eos": True})
        still_running = len(sched.running)
        chunks = [list(s) for s in streams]
    finally:
        sched.max_num_seqs = saved
    assert other.usage.completion_tokens == 2 and other.choices[0].finish_reason == "length"
    assert sched.num_yields > yields and still_running >= 1  # it did not wait for tenant one's answers
    for rest in chunks:
        assert rest[-1].usage.completion_tokens == 150
        assert [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason] == ["length"]
