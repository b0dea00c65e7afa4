"""The embedder (normalised float32, micro-batched, off the loop) and the in-process vector space."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from cache.bert_encoder import BertEncoder, Linear
from cache.embedder import Embedder
from cache.local_index import VectorSpace, _cmp_ids


async def test_embeddings_are_normalised_float32(embedder):
    v = await embedder.embed("How do I reset my password?")
    assert v.dtype == np.float32 and v.shape == (embedder.dim,)
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-4
    many = await embedder.embed_many(["a cat", "a dog", "How do I reset my password?"])
    assert many.shape == (3, embedder.dim)
    assert float(many[2] @ v) > 0.999


LONG = " ".join(f"word{i} and the cache" for i in range(120))  # > 256 word pieces: truncated
TEXTS = ["How do I reset my password?", "a cat", "Which city is Australia's capital, and why?", LONG,
         "Ünïcödé, emoji 🙂 and [brackets] — dashes"]


async def test_fits_says_whether_the_model_reads_a_text_whole(embedder):
    """MiniLM reads 256 word-pieces, [CLS] and [SEP] included: a longer text is cut."""
    assert embedder.max_tokens == 256
    tokens = len(embedder._load().tokenizer(LONG, verbose=False)["input_ids"])
    assert tokens > 256 and not await embedder.fits(LONG)
    assert await embedder.fits("How do I reset my password?")
    assert await embedder.fits("x " * 254)  # 254 pieces + 2 special tokens
    assert not await embedder.fits("x " * 255)
    assert not await embedder.fits("word " * 20_000)  # decided from a prefix
    assert await embedder.fits("a" * 5000 + " b")  # one over-long word is one [UNK]


def st_encode(embedder, texts):
    return embedder._load().encode(texts, convert_to_numpy=True, normalize_embeddings=True,
                                   show_progress_bar=False)


def assert_same_vectors(got, ref):
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert np.abs(got - ref).max() < 1e-5
    assert (got * ref).sum(axis=1).min() > 1 - 1e-5  # cosine with sentence-transformers' vector


def test_lean_encoder_matches_sentence_transformers_encode(embedder):
    """The default path (tokenizer → BertEncoder, oneDNN linears) gives encode()'s vectors: for a
    padded batch of different lengths, a truncated long text, and each text alone (no padding)."""
    assert embedder.kind == ("lean-onednn" if torch.backends.mkldnn.is_available() else "lean")
    ref = st_encode(embedder, TEXTS)
    assert_same_vectors(embedder._encode(TEXTS), ref)
    for text, want in zip(TEXTS, ref, strict=True):
        assert_same_vectors(embedder._encode([text]), want[None])


def test_hf_forward_and_plain_linear_paths_match_too(embedder):
    """The other two numeric paths: HF's BertModel forward (lean=False) and BertEncoder on
    F.linear (no oneDNN)."""
    ref = st_encode(embedder, TEXTS)
    hf = Embedder(lean=False)
    try:
        hf._load()
        assert hf.kind == "hf"
        assert_same_vectors(hf._encode(TEXTS), ref)
    finally:
        hf.close()
    tok, _forward, max_len = embedder._fast
    plain = BertEncoder.from_hf(embedder._load()[0].auto_model, use_onednn=False)
    assert not plain.onednn
    batch = tok(TEXTS, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    assert_same_vectors(plain.encode(batch["input_ids"], batch["attention_mask"]).numpy(), ref)


def test_onednn_linear_equals_f_linear_and_falls_back(monkeypatch):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    x = torch.randn(7, 64, generator=g)
    for gelu in (False, True):
        want = F.linear(x, w, b)
        want = F.gelu(want) if gelu else want
        lin = Linear(w, b, gelu=gelu)
        if lin.pack():
            assert lin.packed is not None
        assert torch.allclose(lin(x), want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    lin = Linear(w, b)
    assert lin.pack() is False and lin.packed is None
    assert torch.allclose(lin(x), F.linear(x, w, b))


async def test_worker_thread_gets_one_intra_op_thread_others_keep_theirs(embedder):
    """A query runs on 1 intra-op thread of the worker thread only; any other thread (such as an
    in-process engine's) keeps torch's count; a big batch uses the default count, and so do a
    few long texts (compute-bound: both threads help)."""

    def in_new_thread() -> int:
        with ThreadPoolExecutor(1) as other:
            return other.submit(lambda: (torch.ones(2).add_(1), torch.get_num_threads())[1]).result()

    default = in_new_thread()
    threads = embedder.worker.executor
    loop = asyncio.get_running_loop()
    await embedder.embed("how many threads does a query use?")
    assert await loop.run_in_executor(threads, torch.get_num_threads) == 1
    assert in_new_thread() == default
    await embedder.embed_many([f"prefill sentence {i}" for i in range(20)])
    assert await loop.run_in_executor(threads, torch.get_num_threads) == default
    await embedder.embed("and one more query afterwards")
    assert await loop.run_in_executor(threads, torch.get_num_threads) == 1
    await embedder.embed_many(["a long passage about rivers and their deltas " * 10] * 2)
    assert await loop.run_in_executor(threads, torch.get_num_threads) == default


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


async def test_tenants_take_turns_on_the_thread_and_lookups_go_first(embedder, monkeypatch):
    """A tenant with four long batches queued first holds a lookup back by the part running, and
    another tenant's one text by at most one more of its parts (first come, first served it waited
    for a part of each of the four)."""
    seen: list[str] = []
    original = embedder._encode

    def spy(texts: list[str]):  # noqa: ANN202
        seen.append(texts[0].split()[0])
        return original(texts)

    monkeypatch.setattr(embedder, "_encode", spy)
    passage = " a long passage about rivers and the deltas they build at the sea" * 20  # ~1,300 characters
    heavy = [asyncio.ensure_future(embedder.embed_many([f"heavy{j}{passage}"] * 9, share="tenant-a"))
             for j in range(4)]
    await asyncio.sleep(0)
    light = asyncio.ensure_future(embedder.embed_many(["light tenant text"], share="tenant-b"))
    lookup = asyncio.ensure_future(embedder.embed("lookup: a query on a chat's path, fresh"))
    await asyncio.gather(*heavy, light, lookup)
    assert len(seen) == 4 * 3 + 2  # parts of at most 4,096 characters: three texts each
    assert seen.index("lookup:") <= 1
    assert seen.index("light") <= 3
    assert embedder.worker.turns["tenant-b"] == 1


async def test_a_lookup_batch_runs_in_parts(embedder, monkeypatch):
    """Found by review: lookups queued together ran as one job of up to 64 texts whatever their
    length (64 long prompts: seconds on no tenant's account, every other turn); they run in parts
    of at most 4,096 characters, as a tenant's batch does."""
    from cache.embedder import EMBED_MANY_PART_CHARS

    sizes: list[int] = []
    original = embedder._encode

    def spy(texts: list[str]):  # noqa: ANN202
        sizes.append(sum(map(len, texts)))
        return original(texts)

    monkeypatch.setattr(embedder, "_encode", spy)
    prompts = [f"lookup {i}: " + "what does the river carry to the delta and why " * 20 for i in range(8)]
    vecs = await asyncio.gather(*(embedder.embed(p) for p in prompts))
    assert len(sizes) >= 2 and max(sizes) <= EMBED_MANY_PART_CHARS
    np.testing.assert_allclose(vecs[5], original([prompts[5]])[0], atol=1e-5)


def test_a_loop_that_ended_with_a_lookup_queued_leaves_the_embedder_usable(embedder):
    """A lookup left as its event loop ended must not leave the lookups' batching task marked as
    running (the next loop's lookups would wait forever)."""

    async def leave() -> None:
        asyncio.ensure_future(embedder.embed("a lookup left behind as its loop ends"))

    asyncio.run(leave())

    async def later():  # noqa: ANN202
        return await asyncio.wait_for(embedder.embed("a lookup in the next loop"), 60)

    assert asyncio.run(later()).shape == (embedder.dim,)
