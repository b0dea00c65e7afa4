"""The embedder (normalised float32, micro-batched, off the loop) and the in-process vector space."""

import asyncio
import threading

import numpy as np

from cache.local_index import VectorSpace, _cmp_ids


async def test_embeddings_are_normalised_float32(embedder):
    v = await embedder.embed("How do I reset my password?")
    assert v.dtype == np.float32 and v.shape == (embedder.dim,)
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-4
    many = await embedder.embed_many(["a cat", "a dog", "How do I reset my password?"])
    assert many.shape == (3, embedder.dim)
    assert float(many[2] @ v) > 0.999


def test_direct_path_matches_sentence_transformers_encode(embedder):
    """The direct tokenizer → transformer → mean-pool → normalise path gives encode()'s vectors,
    also for a padded batch of different lengths."""
    assert embedder._fast is not None  # the bundled MiniLM takes the direct path
    texts = ["How do I reset my password?", "a cat", "Which city is Australia's capital, and why?"]
    ref = embedder._load().encode(texts, convert_to_numpy=True, normalize_embeddings=True,
                                  show_progress_bar=False)
    got = embedder._encode(texts)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.abs(got - ref).max() < 1e-5


async def test_concurrent_calls_are_batched_off_the_loop(embedder):
    loop_thread = threading.get_ident()
    seen: list[int] = []
    original = embedder._encode

    def spy(texts):
        seen.append(threading.get_ident())
        return original(texts)

    embedder._encode = spy
    try:
        before = embedder.batches
        texts = [f"distinct sentence number {i} for batching" for i in range(16)]
        vecs = await asyncio.gather(*(embedder.embed(t) for t in texts))
    finally:
        del embedder._encode
    assert len(vecs) == 16 and all(v.shape == (embedder.dim,) for v in vecs)
    assert embedder.batches - before <= 3  # 16 concurrent calls, one or a few forward passes
    assert seen and all(t != loop_thread for t in seen)


def test_vector_space_add_remove_search():
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((40, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    space = VectorSpace(8)
    for i, v in enumerate(vecs):
        space.add(f"e{i}", f"text {i}", v)
    assert len(space) == 40 and space.mat.shape[0] >= 40
    top = space.search(vecs[7], 3, -1.0)
    assert top[0].entry_id == "e7" and abs(top[0].score - 1.0) < 1e-5
    assert [c.score for c in top] == sorted((c.score for c in top), reverse=True)
    space.remove("e7")
    space.remove("e7")  # idempotent
    assert len(space) == 39 and all(c.entry_id != "e7" for c in space.search(vecs[7], 39, -1.0))
    assert space.search(vecs[39], 1, -1.0)[0].entry_id == "e39"  # the row swapped into e7's place
    space.add("e3", "new text", vecs[5])  # overwrite in place
    assert len(space) == 39 and space.search(vecs[5], 2, 0.99)[0].text in ("text 5", "new text")
    assert space.search(vecs[0], 3, 1.01) == []  # nothing above the threshold


def test_stream_id_order():
    assert _cmp_ids("5-1", "5-0") == 1 and _cmp_ids("4-9", "5-0") == -1 and _cmp_ids("7-2", "7-2") == 0
