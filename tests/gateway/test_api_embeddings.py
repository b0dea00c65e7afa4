"""POST /v1/embeddings with the bundled all-MiniLM-L6-v2, through the official openai client
(which asks for base64 by default) and raw httpx (floats), plus the embedder's batching."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai
import pytest

pytestmark = pytest.mark.slow


def test_embeddings_through_openai_client(api) -> None:  # noqa: ANN001
    client = api.openai()
    raw = client.embeddings.with_raw_response.create(model="all-MiniLM-L6-v2",
                                                     input=["How do I reset my password?",
                                                            "How can I change my password?",
                                                            "The cat sat on the mat."])
    result = raw.parse()
    vectors = np.array([d.embedding for d in result.data], dtype=np.float32)
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2  # paraphrases are closer
    assert result.usage.prompt_tokens == result.usage.total_tokens > 3 * 2
    assert raw.headers["x-request-id"].startswith("req_")
    rows = api.usage_rows(raw.headers["x-request-id"])
    assert len(rows) == 1 and rows[0].endpoint == "embeddings" and rows[0].prompt_tokens == result.usage.prompt_tokens


def test_float_base64_and_dimensions(api) -> None:  # noqa: ANN001
    url, h = api.base_url + "/v1/embeddings", {"authorization": f"Bearer {api.key}"}
    floats = httpx.post(url, json={"model": "all-MiniLM-L6-v2", "input": "hello world", "encoding_format": "float"},
                        headers=h, timeout=60).json()
    b64 = httpx.post(url, json={"model": "all-MiniLM-L6-v2", "input": "hello world", "encoding_format": "base64"},
                     headers=h, timeout=60).json()
    import base64

    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, np.array(floats["data"][0]["embedding"], dtype=np.float32), atol=1e-6)
    # the SDK's encoding_format=None sends null: the default (floats), as a null chat field is
    unset = httpx.post(url, json={"model": "all-MiniLM-L6-v2", "input": "hello world", "encoding_format": None},
                       headers=h, timeout=60)
    assert unset.status_code == 200 and unset.json()["data"][0]["embedding"] == floats["data"][0]["embedding"]
    short = httpx.post(url, json={"model": "all-MiniLM-L6-v2", "input": ["hello world"], "dimensions": 64},
                       headers=h, timeout=60).json()
    assert len(short["data"][0]["embedding"]) == 64
    assert abs(np.linalg.norm(short["data"][0]["embedding"]) - 1.0) < 1e-4
    too_many = httpx.post(url, json={"model": "all-MiniLM-L6-v2", "input": "x", "dimensions": 1024}, headers=h,
                          timeout=60)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "dimensions"
    for bad in ({"model": "all-MiniLM-L6-v2", "input": 12}, {"model": "all-MiniLM-L6-v2", "input": []},
                {"model": "all-MiniLM-L6-v2", "input": ""}, {"model": "all-MiniLM-L6-v2", "input": "x",
                                                               "encoding_format": "int8"}):
        resp = httpx.post(url, json=bad, headers=h, timeout=60)
        assert resp.status_code == 400, (bad, resp.text)
    with pytest.raises(openai.NotFoundError):
        api.openai().embeddings.create(model="text-embedding-3-small", input="x")
    # token ids (tiktoken's, as LangChain's OpenAIEmbeddings sends by default) mean nothing to MiniLM
    for ids in ([15339, 1917], [[15339, 1917], [9906]]):
        resp = httpx.post(url, json={"model": "all-MiniLM-L6-v2", "input": ids}, headers=h, timeout=60)
        err = resp.json()["error"]
        assert resp.status_code == 400 and (err["param"], err["code"]) == ("input", "unsupported_parameter"), ids
        assert "check_embedding_ctx_length=False" in err["message"]  # what a LangChain user must set


def test_concurrent_calls_are_batched(api) -> None:  # noqa: ANN001
    """Concurrent aembed calls share forward passes and each gets its own rows back."""
    embedder = api.loop.run(api.app.state.pagegate.get_embedder())
    texts = [f"sentence number {i}" for i in range(12)]
    expected = embedder.embed(texts)
    calls = []

    async def run() -> list:
        original = embedder.embed

        def counting(batch: list[str]):  # noqa: ANN202
            calls.append(len(batch))
            return original(batch)

        embedder.embed = counting
        try:
            return await asyncio.gather(*(embedder.aembed([t]) for t in texts))
        finally:
            embedder.embed = original

    results = api.loop.run(run())
    assert np.allclose(np.vstack(results), expected, atol=1e-5)
    assert sum(calls) == 12 and len(calls) < 12


def test_one_minilm_when_the_cache_is_on(api_cached) -> None:  # noqa: ANN001
    """With the semantic cache on, /v1/embeddings uses the cache's embedder (one model loaded),
    with the same vectors and token counts as the stand-alone embedder."""
    from gateway.embedder import Embedder, SharedEmbedder

    texts = ["How do I reset my password?", "The cat sat on the mat."]
    resp = httpx.post(api_cached.base_url + "/v1/embeddings", timeout=60,
                      json={"model": "all-MiniLM-L6-v2", "input": texts, "encoding_format": "float"},
                      headers={"authorization": f"Bearer {api_cached.key}"})
    assert resp.status_code == 200, resp.text
    state = api_cached.app.state.pagegate
    assert isinstance(state.embedder, SharedEmbedder) and state.embedder.inner is state.cache.embedder
    alone = Embedder()
    try:
        expected = alone.embed(texts)
        counts = alone.count_tokens(texts)
    finally:
        alone.close()
    got = np.array([d["embedding"] for d in resp.json()["data"]], dtype=np.float32)
    assert np.allclose(got, expected, atol=1e-5)
    assert resp.json()["usage"]["prompt_tokens"] == sum(counts)
    # the request's counting and its part ran in its tenant's turns on the cache's embedder thread
    assert state.cache.embedder.worker.turns[api_cached.tenant_id] >= 2
    # and /metrics shows the thread's time by work and tenant, as JSON and as Prometheus text
    embedder = httpx.get(api_cached.base_url + "/metrics", timeout=30).json()["embedder"]
    busy = {(work, tenant): seconds for work, tenant, seconds in embedder["busy"]}
    assert busy[("embeddings", str(api_cached.tenant_id))] > 0 and embedder["waiting"] == 0
    text = httpx.get(api_cached.base_url + "/metrics?format=prometheus", timeout=30).text
    line = next(x for x in text.splitlines()
                if x.startswith(f'pagegate_embedder_busy_seconds_total{{work="embeddings",tenant="{api_cached.tenant_id}"}}'))
    assert float(line.rsplit(" ", 1)[1]) > 0


@pytest.mark.parametrize("server", ["api", "api_cached"])
def test_an_input_longer_than_the_model_reads_is_refused(server, request) -> None:  # noqa: ANN001
    """All-MiniLM reads 256 tokens: a longer input is a 400 ``context_length_exceeded`` naming it
    (as OpenAI and vLLM do), not embedded from its first 256 tokens; 256 exactly still passes."""
    api = request.getfixturevalue(server)
    client = api.openai()
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=["short", "word " * 1000])
    # the item named, as for an empty one (found by QA: this one said only "input")
    assert err.value.code == "context_length_exceeded" and err.value.param == "input[1]"
    assert "Input 1 has 1002 tokens" in err.value.message and "256 tokens" in err.value.message
    fits = client.embeddings.create(model="all-MiniLM-L6-v2", input="word " * 254)  # + [CLS], [SEP]
    assert fits.usage.prompt_tokens == 256
    with pytest.raises(openai.BadRequestError) as err:  # one huge text: refused by its head's count
        client.embeddings.create(model="all-MiniLM-L6-v2", input="word " * 200_000)
    assert err.value.code == "context_length_exceeded" and "Your input has at least " in err.value.message
    assert err.value.param == "input"


@pytest.mark.parametrize("server", ["api", "api_cached"])
def test_a_client_that_leaves_stops_its_batch_and_pays_nothing(server, request) -> None:  # noqa: ANN001
    """Found by a security QA: a client that left a 2,048-text batch had it embedded to the end (90 s
    more of the one embedder thread, every tenant's embeddings and cache lookups slowed), and its
    row said ok with every token billed. It is now stopped at the next part and recorded as
    aborted, 0 tokens; the embedder then answers others at once."""
    import time

    api = request.getfixturevalue(server)
    tenant_id, key = api.make_tenant()
    texts = [f"request {i}: " + "the quick brown fox jumps over the lazy dog " * 20 for i in range(2048)]
    with pytest.raises(httpx.TimeoutException):
        httpx.post(api.base_url + "/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": texts},
                   headers={"authorization": f"Bearer {key}"}, timeout=1.5)
    rows = []
    for _ in range(200):  # the row is written when the handler ends, at the batch's next part
        rows = [r for r in api.usage_rows() if r.tenant_id == tenant_id]
        if rows:
            break
        time.sleep(0.1)
    assert len(rows) == 1 and rows[0].status == "aborted" and rows[0].prompt_tokens == 0, rows
    assert rows[0].latency_ms < 15_000  # stopped, not run to the end (a minute or more here)
    small = api.openai().embeddings.create(model="all-MiniLM-L6-v2", input="still served")
    assert len(small.data) == 1
