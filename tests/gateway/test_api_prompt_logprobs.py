"""Scoring a prompt through ``/v1/completions``: ``echo`` with ``logprobs`` gives the echoed
prompt's tokens their logprobs too (the first none), and ``max_tokens: 0`` scores without
generating, as OpenAI's legacy API and vLLM do (what lm-evaluation-harness' loglikelihood tasks
send). Over HTTP with the official client, on the real model."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.test_api_validation import assert_error

pytestmark = pytest.mark.slow

TEXT = "The quick brown fox jumps over the lazy dog because it was"


def _score(client, model: str, prompt, **kw):  # noqa: ANN001, ANN202
    return client.completions.create(model=model, prompt=prompt, echo=True, logprobs=kw.pop("logprobs", 3),
                                     temperature=0, **{"max_tokens": 0, **kw})


def test_max_tokens_zero_scores_the_prompt(api) -> None:  # noqa: ANN001
    client = api.openai()
    raw = client.completions.with_raw_response.create(model=api.model, prompt=TEXT, echo=True, logprobs=3,
                                                      max_tokens=0, temperature=0)
    resp = raw.parse()
    choice = resp.choices[0]
    lp = choice.logprobs
    assert choice.text == TEXT and choice.finish_reason == "length"
    assert "".join(lp.tokens) == TEXT
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == resp.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(v, float) and v <= 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    for j in range(1, len(lp.tokens)):
        top = lp.top_logprobs[j]
        assert 3 <= len(top) <= 4 and top[lp.tokens[j]] == pytest.approx(lp.token_logprobs[j])
    assert resp.usage.completion_tokens == 0 and resp.usage.prompt_tokens_details.cached_tokens == 0
    rows = api.usage_rows(raw.headers["x-request-id"])
    assert len(rows) == 1 and (rows[0].status, rows[0].prompt_tokens, rows[0].completion_tokens) == \
        ("ok", resp.usage.prompt_tokens, 0)
    chunks = [c for chunk in _score(client, api.model, TEXT, stream=True) for c in chunk.choices]
    assert [(c.text, c.finish_reason) for c in chunks] == [(TEXT, None), ("", "length")]
    assert chunks[0].logprobs.tokens == lp.tokens
    assert chunks[0].logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-6)


def test_a_prompt_tokens_logprob_is_the_models_next_token_logprob_there(api) -> None:  # noqa: ANN001
    """Token ``j``'s scored logprob and alternatives are what generating one token after the first
    ``j`` tokens reports (the same distribution, computed in another batch shape)."""
    client = api.openai()
    ids = api.app.state.pagegate.engine.encode(TEXT)
    scored = _score(client, api.model, ids, logprobs=5).choices[0].logprobs
    for j in (1, 4, len(ids) - 1):
        nxt = client.completions.create(model=api.model, prompt=ids[:j], max_tokens=1, temperature=0,
                                        logprobs=5).choices[0].logprobs
        want = nxt.top_logprobs[0]
        got = scored.top_logprobs[j]
        assert set(got) - {scored.tokens[j]} <= set(want) | {scored.tokens[j]}
        for token, value in want.items():
            assert got[token] == pytest.approx(value, abs=2e-3), (j, token)


def test_echo_with_logprobs_then_generates_as_without_echo(api) -> None:  # noqa: ANN001
    client = api.openai()
    plain = client.completions.create(model=api.model, prompt=TEXT, max_tokens=4, temperature=0, logprobs=2)
    echoed = _score(client, api.model, TEXT, max_tokens=4, logprobs=2)
    p = echoed.usage.prompt_tokens
    c, g = echoed.choices[0], plain.choices[0]
    assert c.text == TEXT + g.text and c.finish_reason == g.finish_reason
    assert c.logprobs.tokens[p:] == g.logprobs.tokens and "".join(c.logprobs.tokens[:p]) == TEXT
    assert c.logprobs.token_logprobs[p:] == pytest.approx(g.logprobs.token_logprobs, abs=1e-4)
    assert c.logprobs.text_offset[p:] == [len(TEXT) + o for o in g.logprobs.text_offset]
    assert echoed.usage.completion_tokens == plain.usage.completion_tokens


@pytest.mark.parametrize("off_the_loop", [False, True])
def test_a_streamed_scored_batch_matches_the_whole_one(api, monkeypatch, off_the_loop) -> None:  # noqa: ANN001
    """Two prompts, two choices each: every choice opens with its own prompt's echo and logprobs;
    the stream's pieces add up to the whole answer. Past ``LOGPROBS_ON_A_THREAD`` values the
    echo chunks and the whole answer are built on a worker thread: the same."""
    if off_the_loop:
        monkeypatch.setattr("gateway.chat_service.LOGPROBS_ON_A_THREAD", 10)
    client = api.openai()
    prompts = [TEXT, "One, two, three, four,"]
    kw = dict(max_tokens=3, n=2, logprobs=1)
    whole = _score(client, api.model, prompts, **kw)
    texts, tokens, values, offsets, first = {}, {}, {}, {}, {}
    for chunk in _score(client, api.model, prompts, stream=True, **kw):
        for c in chunk.choices:
            first.setdefault(c.index, c.text)
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.logprobs is not None:
                tokens.setdefault(c.index, []).extend(c.logprobs.tokens)
                values.setdefault(c.index, []).extend(c.logprobs.token_logprobs)
                offsets.setdefault(c.index, []).extend(c.logprobs.text_offset)
    assert first == {i: prompts[i // 2] for i in range(4)}
    assert texts == {c.index: c.text for c in whole.choices}
    assert tokens == {c.index: c.logprobs.tokens for c in whole.choices}
    assert offsets == {c.index: c.logprobs.text_offset for c in whole.choices}
    for c in whole.choices:
        assert values[c.index][0] is None and c.logprobs.token_logprobs[0] is None
        assert values[c.index][1:] == pytest.approx(c.logprobs.token_logprobs[1:], abs=1e-6)
        assert c.text.startswith(prompts[c.index // 2])


def test_a_scored_prompt_is_computed_whole_even_when_cached(api) -> None:  # noqa: ANN001
    """The prefix cache holds no logits: a scored prompt reports no cached tokens and the same
    logprobs the second time."""
    client = api.openai()
    prompt = "System: you are a careful assistant. " * 6 + "User: hello"
    client.completions.create(model=api.model, prompt=prompt, max_tokens=1, temperature=0)
    hit = client.completions.create(model=api.model, prompt=prompt, max_tokens=1, temperature=0)
    assert hit.usage.prompt_tokens_details.cached_tokens > 0  # the blocks are cached
    a, b = (_score(client, api.model, prompt) for _ in range(2))
    assert a.usage.prompt_tokens_details.cached_tokens == b.usage.prompt_tokens_details.cached_tokens == 0
    assert b.choices[0].logprobs.token_logprobs[1:] == pytest.approx(a.choices[0].logprobs.token_logprobs[1:],
                                                                        abs=1e-5)


def test_echo_of_token_ids_shows_their_text(api) -> None:  # noqa: ANN001
    client = api.openai()
    ids = api.app.state.pagegate.engine.encode(TEXT)
    by_ids = _score(client, api.model, ids)
    by_text = _score(client, api.model, TEXT)
    assert by_ids.choices[0].text == TEXT
    assert by_ids.choices[0].logprobs.tokens == by_text.choices[0].logprobs.tokens


def test_max_tokens_zero_needs_echo(api) -> None:  # noqa: ANN001
    resp = httpx.post(api.base_url + "/v1/completions", headers={"authorization": f"Bearer {api.key}"},
                      json={"model": api.model, "prompt": TEXT, "max_tokens": 0}, timeout=60)
    assert_error(resp, 400, param="max_tokens")
    assert "echo" in resp.json()["error"]["message"]


def test_echo_with_max_tokens_zero_and_no_logprobs_answers_the_prompt(api) -> None:  # noqa: ANN001
    """Found by QA: the engine's "max_tokens must be >= 1" came back, where the gateway had just
    said 0 goes with echo. OpenAI's legacy API answers the prompt alone."""
    client = api.openai()
    resp = client.completions.create(model=api.model, prompt=TEXT, echo=True, max_tokens=0)
    choice = resp.choices[0]
    assert (choice.text, choice.finish_reason, choice.logprobs) == (TEXT, "length", None)
    assert resp.usage.completion_tokens == 0 and resp.usage.prompt_tokens > 0
    chunks = [c for chunk in client.completions.create(model=api.model, prompt=TEXT, echo=True, max_tokens=0,
                                                       stream=True) for c in chunk.choices]
    assert "".join(c.text for c in chunks) == TEXT and chunks[-1].finish_reason == "length"


def test_a_prompt_may_fill_the_context_when_nothing_follows_it() -> None:
    """Found by QA: a prompt of exactly the context's length could not be scored (``max_tokens``
    0), and the refusal said "you requested 8192 tokens" of a context of 8192."""
    from gateway.errors import ApiError
    from gateway.request_checks import resolve_max_tokens

    assert resolve_max_tokens(0, 8192, 8192) == 0
    for requested, prompt in ((1, 8192), (0, 8193), (None, 8192)):
        with pytest.raises(ApiError):
            resolve_max_tokens(requested, prompt, 8192)


def test_echoed_ids_that_end_inside_a_character_leave_it_to_the_answer(api) -> None:  # noqa: ANN001
    """Found by QA: ids ending with an emoji's first bytes were echoed with U+FFFD for them, and the
    answer then showed the emoji whole: its bytes twice, and ``text_offset`` off by one. The echo
    now leaves the unfinished character to the answer (nothing follows: U+FFFD, as before)."""
    client = api.openai()
    engine = api.app.state.pagegate.engine
    ids = engine.encode("a 😊")
    cut = next(i for i in range(1, len(ids)) if not _whole_utf8(b"".join(engine.token_bytes(ids[:i]))))
    prompt = ids[:cut]  # ends inside the emoji
    resp = client.completions.create(model=api.model, prompt=prompt, echo=True, logprobs=1, max_tokens=3,
                                     temperature=0)
    lp = resp.choices[0].logprobs
    every_byte = b"".join(_name_bytes(name) for name in lp.tokens)  # the prompt's tokens and the answer's
    assert resp.choices[0].text == every_byte.decode("utf-8", "replace")
    scored = client.completions.create(model=api.model, prompt=prompt, echo=True, max_tokens=0)
    assert scored.choices[0].text.endswith("\ufffd")


def _whole_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _name_bytes(name: str) -> bytes:
    """A logprobs token's bytes: its text, or the ``bytes:\\xf0\\x9f`` it is shown as."""
    if name.startswith("bytes:"):
        return bytes(int(h, 16) for h in name[len("bytes:"):].split("\\x")[1:])
    return name.encode()


def test_vllms_prompt_logprobs_field(api) -> None:  # noqa: ANN001
    """vLLM's own shape for the same scores: ``prompt_logprobs: k`` on /v1/completions puts on each
    choice, and on chat at the top, per prompt token {token id: {logprob, rank, decoded_token}}, the
    prompt's token first; the values are the echo's."""
    h = {"authorization": f"Bearer {api.key}"}
    url = api.base_url + "/v1"
    body = {"model": api.model, "prompt": TEXT, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
    got = httpx.post(f"{url}/completions", json=body, headers=h, timeout=60).json()
    echoed = _score(api.openai(), api.model, TEXT, logprobs=2).choices[0].logprobs
    ids = api.app.state.pagegate.engine.encode(TEXT)
    scored = got["choices"][0]["prompt_logprobs"]
    assert len(scored) == len(ids) and scored[0] is None
    for j in range(1, len(ids)):
        own = scored[j][str(ids[j])]
        assert list(scored[j])[0] == str(ids[j]) and 2 <= len(scored[j]) <= 3
        assert own["logprob"] == pytest.approx(echoed.token_logprobs[j], abs=1e-5)
        assert own["decoded_token"] == echoed.tokens[j]
        ranks = sorted(v["rank"] for k, v in scored[j].items() if k != str(ids[j]))
        assert ranks in ([1, 2], [1], [2]) and (own["rank"] == 1) == (max(echoed.top_logprobs[j].values())
                                                                       == pytest.approx(own["logprob"]))
    assert "prompt_logprobs" not in httpx.post(f"{url}/completions", json={**body, "prompt_logprobs": None},
                                               headers=h, timeout=60).json()["choices"][0]
    chat = {"model": api.model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 1,
            "prompt_logprobs": 0}
    raw = httpx.post(f"{url}/chat/completions", json=chat, headers=h, timeout=60)
    answer = raw.json()
    assert answer["prompt_logprobs"][0] is None and all(len(p) == 1 for p in answer["prompt_logprobs"][1:])
    assert len(answer["prompt_logprobs"]) == answer["usage"]["prompt_tokens"]
    assert "prompt_logprobs" not in httpx.post(f"{url}/chat/completions", json={**chat, "prompt_logprobs": None},
                                               headers=h, timeout=60).json()
    for route, b in (("completions", body), ("chat/completions", chat)):  # not streamed, as vLLM answers
        assert_error(httpx.post(f"{url}/{route}", json={**b, "stream": True}, headers=h, timeout=60), 400,
                     param="prompt_logprobs")
    assert_error(httpx.post(f"{url}/completions", json={**body, "prompt_logprobs": 21}, headers=h, timeout=60),
                 400, param="prompt_logprobs")


def test_prompt_logprobs_bypass_the_semantic_cache(api_cached) -> None:  # noqa: ANN001
    api = api_cached
    _tid, key = api.make_tenant()
    cache = api.app.state.pagegate.cache
    namespace = api.loop.run(api.services.auth.authenticate(f"Bearer {key}")).cache_namespace
    chat = {"model": api.model, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 2,
            "temperature": 0, "prompt_logprobs": 1}
    for _ in range(2):
        raw = httpx.post(api.base_url + "/v1/chat/completions", json=chat,
                         headers={"authorization": f"Bearer {key}"}, timeout=60)
        assert raw.headers["x-cache"] == "bypass" and raw.json()["prompt_logprobs"][0] is None
    assert api.loop.run(cache.store_.count(cache.store_.keys(namespace))) == 0  # a stored answer has none to show


def test_echo_shows_its_own_number_of_alternatives_beside_prompt_logprobs(api) -> None:  # noqa: ANN001
    """Found by a re-check: with ``logprobs: 1`` and ``prompt_logprobs: 5`` the echoed prompt's
    positions showed 5 alternatives (the engine makes the larger number for both)."""
    h = {"authorization": f"Bearer {api.key}"}
    body = {"model": api.model, "prompt": TEXT, "echo": True, "logprobs": 1, "prompt_logprobs": 5, "max_tokens": 2,
            "temperature": 0}
    choice = httpx.post(api.base_url + "/v1/completions", json=body, headers=h, timeout=60).json()["choices"][0]
    sizes = [None if t is None else len(t) for t in choice["logprobs"]["top_logprobs"]]
    assert sizes[0] is None and all(1 <= n <= 2 for n in sizes[1:]), sizes
    assert all(len(p) >= 5 for p in choice["prompt_logprobs"][1:])
