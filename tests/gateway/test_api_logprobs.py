"""Logprobs over HTTP with the official ``openai`` client: chat (``logprobs``, ``top_logprobs``)
and text completions (``logprobs``), whole and streamed, shaped as OpenAI's; the values are the
engine's, token texts and bytes the tokenizer's; the semantic cache stays out of the way."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Name three colours of the French flag."}]


def _check_chat_entries(content, top_n: int) -> None:  # noqa: ANN001
    for entry in content:
        assert bytes(entry.bytes).decode(errors="replace") in (entry.token, "\ufffd") or entry.token.startswith("bytes:")
        assert entry.logprob <= 0 and len(entry.top_logprobs) == top_n
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        if top_n:  # greedy: the chosen token is the most likely one
            assert entry.top_logprobs[0].token == entry.token
            assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-6


def test_chat_logprobs_whole_and_streamed_agree(api) -> None:  # noqa: ANN001
    client = api.openai()
    whole = client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=3)
    choice = whole.choices[0]
    content = choice.logprobs.content
    assert len(content) == whole.usage.completion_tokens == 8
    # the tokens' bytes spell the answer (the text is the tokens' bytes, decoded)
    assert b"".join(bytes(e.bytes) for e in content).decode() == choice.message.content
    _check_chat_entries(content, 3)

    stream = client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=8, temperature=0,
                                            logprobs=True, top_logprobs=3, stream=True)
    streamed = [e for chunk in stream for c in chunk.choices if c.logprobs is not None for e in c.logprobs.content]
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-4)


def test_chat_logprobs_without_top_and_with_n(api) -> None:  # noqa: ANN001
    client = api.openai()
    resp = client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=5, temperature=0.9,
                                          seed=3, n=2, logprobs=True)
    for choice in resp.choices:
        assert len(choice.logprobs.content) == 5
        _check_chat_entries(choice.logprobs.content, 0)
    plain = client.chat.completions.create(model=api.model, messages=MESSAGES, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None  # not asked: null, as before


def test_completions_logprobs(api) -> None:  # noqa: ANN001
    client = api.openai()
    resp = client.completions.create(model=api.model, prompt="The capital of France is", max_tokens=6,
                                     temperature=0, logprobs=2)
    choice = resp.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == choice.text or any(t.startswith("bytes:") for t in lp.tokens)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert token in top and top[token] == pytest.approx(value)  # greedy: the chosen one is listed
        assert max(top.values()) == pytest.approx(value)
    stream = client.completions.create(model=api.model, prompt="The capital of France is", max_tokens=6,
                                       temperature=0, logprobs=2, stream=True)
    chunks = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs is not None]
    assert [t for c in chunks for t in c.tokens] == lp.tokens
    assert [o for c in chunks for o in c.text_offset] == lp.text_offset
    # two streamed choices keep their own offsets
    stream = client.completions.create(model=api.model, prompt="The capital of France is", max_tokens=5,
                                       temperature=0, n=2, logprobs=0, stream=True)
    offsets: dict[int, list[int]] = {0: [], 1: []}
    texts = {0: "", 1: ""}
    for chunk in stream:
        for c in chunk.choices:
            if c.logprobs is not None:
                offsets[c.index] += c.logprobs.text_offset
                assert c.logprobs.text_offset[0] == len(texts[c.index])
            texts[c.index] += c.text
    assert all(len(o) == 5 and o[0] == 0 for o in offsets.values())


def test_a_split_character_shows_its_bytes(api) -> None:  # noqa: ANN001
    """An emoji is several byte-level tokens: each is shown as ``bytes:\\x..`` with its real bytes,
    which join to the character (vLLM shows U+FFFD and its bytes, losing them)."""
    from gateway.formats import TokenNames, chat_logprobs

    engine = api.app.state.pagegate.engine
    ids = engine.encode("😊")
    assert len(ids) > 1
    shown = chat_logprobs([(t, -1.0, ((t, -1.0),)) for t in ids], TokenNames.for_engine(engine))["content"]
    assert b"".join(bytes(e["bytes"]) for e in shown) == "😊".encode()
    assert all(e["token"].startswith("bytes:\\x") for e in shown)
    assert bytes.fromhex("".join(e["token"][len("bytes:"):].replace("\\x", "") for e in shown)).decode() == "😊"
    assert [t["token"] for e in shown for t in e["top_logprobs"]] == [e["token"] for e in shown]


def test_an_answer_that_stops_on_eos_lists_no_entry_for_it(api) -> None:  # noqa: ANN001
    """The closing <|im_end|> has no text, so no entry (OpenAI's answers end with the last text
    token): the entries' bytes spell the answer, streamed the same."""
    client = api.openai()
    kw = dict(model=api.model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=60, temperature=0,
              logprobs=True)
    whole = client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.finish_reason == "stop"
    assert len(choice.logprobs.content) == whole.usage.completion_tokens - 1
    assert b"".join(bytes(e.bytes) for e in choice.logprobs.content).decode() == choice.message.content
    chunks = [c for chunk in client.chat.completions.create(**kw, stream=True) for c in chunk.choices]
    streamed = [e.token for c in chunks if c.logprobs is not None for e in c.logprobs.content]
    assert streamed == [e.token for e in choice.logprobs.content]
    assert all(c.logprobs is None or c.logprobs.content for c in chunks)  # no empty chunk for the EOS


def test_logprobs_bypass_the_semantic_cache(api_cached) -> None:  # noqa: ANN001
    api = api_cached
    _tid, key = api.make_tenant()
    client = api.openai(key)
    cache = api.app.state.pagegate.cache
    namespace = api.loop.run(api.services.auth.authenticate(f"Bearer {key}")).cache_namespace
    stored = lambda: api.loop.run(cache.store_.count(cache.store_.keys(namespace)))  # noqa: E731
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=api.model, messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True)
        assert raw.headers["x-cache"] == "bypass"
        assert len(raw.parse().choices[0].logprobs.content) == 3
    assert stored() == 0  # nothing stored for them
    first = client.chat.completions.with_raw_response.create(model=api.model, messages=MESSAGES, max_tokens=3,
                                                              temperature=0)
    assert first.headers["x-cache"] == "miss"  # the same question without logprobs is cached as usual
    assert stored() == 1


def test_a_model_without_a_tokenizer_refuses_logprobs_by_name() -> None:
    """Token ids in, but no tokenizer to name the tokens: a 400 naming logprobs, not a failed stream."""
    from gateway.errors import ApiError
    from gateway.request_checks import token_names_for
    from gateway.schemas import CompletionRequest

    class NoTokenizer:
        def token_bytes(self, ids: list[int]) -> list[bytes]:
            raise ValueError("this model has no tokenizer; token texts are unknown")

    body = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2], "logprobs": 1})
    with pytest.raises(ApiError) as caught:
        token_names_for(body, NoTokenizer())
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "unsupported_parameter", "logprobs")
    plain = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2]})
    assert token_names_for(plain, NoTokenizer()) is None


def test_a_large_answer_is_built_off_the_event_loop_alike(api, monkeypatch) -> None:  # noqa: ANN001
    """Past ``LOGPROBS_ON_A_THREAD`` values the whole answer is built on a worker thread: the same
    answer as on the event loop."""
    from gateway import chat_service

    client = api.openai()
    kw = dict(model=api.model, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=4)
    on_loop = client.chat.completions.create(**kw)
    threads = []
    real = chat_service.asyncio.to_thread
    monkeypatch.setattr(chat_service, "LOGPROBS_ON_A_THREAD", 0)
    monkeypatch.setattr(chat_service.asyncio, "to_thread", lambda *a, **k: threads.append(1) or real(*a, **k))
    on_thread = client.chat.completions.create(**kw)
    assert threads  # it took the thread
    assert on_thread.choices[0].logprobs.model_dump() == on_loop.choices[0].logprobs.model_dump()
    assert on_thread.choices[0].message.content == on_loop.choices[0].message.content
