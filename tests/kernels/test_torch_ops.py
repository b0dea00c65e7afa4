"""The CPU fast path (``kernels.torch_ops``) against the reference, on ragged batches with
shuffled (non-contiguous) block tables, decodes, whole prompts, chunks over a cached prefix,
GQA and MHA."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import paged_attention_ref, write_kv_cache_ref
from kernels.torch_ops import paged_attention_torch, write_kv_cache_torch

# (dtype, q heads, kv heads, head_dim, block_size, q_lens, seq_lens)
CASES = {
    "decode-only-gqa3": (torch.float32, 9, 3, 64, 16, [1, 1, 1, 1], [1, 17, 150, 33]),
    "prefill-only-mha": (torch.float32, 4, 4, 32, 8, [5, 20], [5, 20]),
    "mixed-gqa3-prefix-chunks": (torch.float32, 9, 3, 64, 16, [1, 7, 1, 21, 5], [37, 7, 16, 50, 83]),
    "gqa4-bs32-zero-len": (torch.float32, 8, 2, 64, 32, [3, 0, 1, 40], [45, 12, 1, 70]),
    "gqa8-d128": (torch.float32, 8, 1, 128, 16, [1, 9, 1], [65, 9, 31]),
    "bf16-mixed": (torch.bfloat16, 8, 2, 64, 16, [2, 1, 17], [19, 33, 60]),
}
ATOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("with_hints", [True, False])
def test_attention_equals_reference(case, with_hints, paged_batch):
    dtype, hq, hkv, d, bs, q_lens, seq_lens = case
    b = paged_batch(q_lens=q_lens, seq_lens=seq_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                    block_size=bs, dtype=dtype)
    b.query, b.key_cache, b.value_cache = b.query.cpu(), b.key_cache.cpu(), b.value_cache.cpu()
    for name in ("query_start_loc", "seq_lens", "block_tables"):
        setattr(b, name, getattr(b, name).cpu())
    expected = paged_attention_ref(b.query, b.key_cache, b.value_cache, **b.kwargs())
    hints = dict(max_query_len=max(q_lens), max_seq_len=max(seq_lens)) if with_hints else {}
    got = paged_attention_torch(b.query, b.key_cache, b.value_cache, **b.kwargs(), **hints)
    assert got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), atol=ATOL[dtype], rtol=1e-4)


def test_decode_fast_path_ignores_padding_blocks(paged_batch):
    b = paged_batch(q_lens=[1, 1, 1], seq_lens=[3, 40, 18], num_q_heads=6, num_kv_heads=2, head_dim=16,
                    block_size=8, dtype=torch.float32)
    b.block_tables = b.block_tables.cpu()
    b.block_tables[0, 1:] = -1  # padding past the length may be anything
    args = (b.query.cpu(), b.key_cache.cpu(), b.value_cache.cpu())
    kw = dict(query_start_loc=b.query_start_loc.cpu(), seq_lens=b.seq_lens.cpu(),
              block_tables=b.block_tables, scale=b.scale)
    expected = paged_attention_ref(*args, **kw)
    got = paged_attention_torch(*args, **kw, max_query_len=1, max_seq_len=40)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("skip", [False, True])
def test_write_kv_cache_equals_reference(skip):
    gen = torch.Generator().manual_seed(0)
    shape = (6, 4, 2, 8)
    kc0, vc0 = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    key, value = torch.randn(5, 2, 8, generator=gen), torch.randn(5, 2, 8, generator=gen)
    slots = torch.tensor([17, 3, -1 if skip else 4, 22, 9])
    kr, vr, kt, vt = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
    write_kv_cache_ref(key, value, kr, vr, slots)
    write_kv_cache_torch(key, value, kt, vt, slots)
    assert torch.equal(kr, kt) and torch.equal(vr, vt)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_with_shared_prefix_blocks_equals_reference(dtype):
    """Sequences whose tables start with the same blocks (a shared system prompt) take the
    cascade path: the shared part once for all, merged with each sequence's own blocks."""
    gen = torch.Generator().manual_seed(1)
    bs, hq, hkv, d, nblocks = 16, 9, 3, 64, 40
    kc = torch.randn(nblocks, bs, hkv, d, generator=gen).to(dtype)
    vc = torch.randn(nblocks, bs, hkv, d, generator=gen).to(dtype)
    shared = [7, 3, 11]
    own = [[20, 21], [22], [23, 24, 25], [26]]
    seq_lens = torch.tensor([3 * bs + 20, 3 * bs + 1, 3 * bs + 40, 3 * bs + 16], dtype=torch.int32)
    rows = [shared + o for o in own]
    width = max(map(len, rows)) + 1
    tables = torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int32)
    query = torch.randn(4, hq, d, generator=gen).to(dtype)
    kw = dict(query_start_loc=torch.arange(5, dtype=torch.int32), seq_lens=seq_lens, block_tables=tables,
              scale=d**-0.5)
    expected = paged_attention_ref(query, kc, vc, **kw)
    got = paged_attention_torch(query, kc, vc, **kw, max_query_len=1, max_seq_len=int(seq_lens.max()))
    torch.testing.assert_close(got.float(), expected.float(), atol=ATOL[dtype], rtol=1e-4)
    # a single-token-past-the-prefix sequence (all of its context shared but the last token)
    got_one = paged_attention_torch(query[:2], kc, vc, **{**kw, "seq_lens": seq_lens[:2],
                                    "block_tables": tables[:2], "query_start_loc": kw["query_start_loc"][:3]},
                                    max_query_len=1)
    torch.testing.assert_close(got_one.float(), expected[:2].float(), atol=ATOL[dtype], rtol=1e-4)


def test_cascade_when_a_context_is_entirely_shared():
    """The shortest sequence's context is exactly the shared blocks: its own part is empty
    (fully masked) and must weigh nothing, even with very negative scores."""
    gen = torch.Generator().manual_seed(2)
    bs, hq, hkv, d = 8, 4, 2, 16
    kc = torch.randn(10, bs, hkv, d, generator=gen).abs() * 30  # every score strongly negative:
    vc = torch.randn(10, bs, hkv, d, generator=gen)                # exp(score - max) would underflow
    tables = torch.tensor([[4, 6, 1, -1], [4, 6, 2, 3]], dtype=torch.int32)
    seq_lens = torch.tensor([2 * bs, 3 * bs + 5], dtype=torch.int32)
    query = -torch.randn(2, hq, d, generator=gen).abs() * 30
    kw = dict(query_start_loc=torch.arange(3, dtype=torch.int32), seq_lens=seq_lens, block_tables=tables,
              scale=d**-0.5)
    expected = paged_attention_ref(query, kc, vc, **kw)
    got = paged_attention_torch(query, kc, vc, **kw, max_query_len=1)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.fixture
def cascade_anywhere(monkeypatch):
    """The prefill cascade on small test shapes (its size thresholds off)."""
    import kernels.torch_ops as ops

    for name in ("CASCADE_MIN_CHUNKS", "CASCADE_MIN_SHARED", "CASCADE_MIN_RATIO"):
        monkeypatch.setattr(ops, name, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_chunks_behind_a_shared_prefix_equal_reference(dtype, cascade_anywhere):
    """Prompts that hit the same cached leading blocks (a shared system prompt) take the prefill
    cascade: those blocks once for every chunk, each chunk's own blocks causally, merged by
    log-sum-exp. A decode row rides along; one chunk's cached context ends inside the third shared
    column, so only two columns are shared."""
    gen = torch.Generator().manual_seed(3)
    bs, hq, hkv, d, nblocks = 16, 9, 3, 64, 60
    kc = torch.randn(nblocks, bs, hkv, d, generator=gen).to(dtype)
    vc = torch.randn(nblocks, bs, hkv, d, generator=gen).to(dtype)
    shared = [7, 3, 11]
    rows = [shared + [20, 21], shared + [22], [9, 8, 30, 31], shared + [23, 24, 25], shared + [26]]
    q_lens = [14, 5, 1, 40, 9]
    seq_lens = [3 * bs + 20, 3 * bs + 9, 60, 3 * bs + 40, 2 * bs + 12]  # the last: cached context 2*bs+3
    rows[4] = shared[:2] + [27]
    width = max(map(len, rows)) + 1
    tables = torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int32)
    query = torch.randn(sum(q_lens), hq, d, generator=gen).to(dtype)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    kw = dict(query_start_loc=starts, seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=tables,
              scale=d**-0.5)
    expected = paged_attention_ref(query, kc, vc, **kw)
    got = paged_attention_torch(query, kc, vc, **kw, max_query_len=max(q_lens), max_seq_len=max(seq_lens))
    torch.testing.assert_close(got.float(), expected.float(), atol=ATOL[dtype], rtol=1e-4)


def test_prefill_cascade_is_taken_and_skipped_where_it_should(monkeypatch, cascade_anywhere):
    """Shared cached blocks: one fused call for the shared part and one for the chunks' own parts; a chunk whose
    first new token lies inside the common blocks (no cached context): the plain path."""
    import kernels.torch_ops as ops

    calls = []
    real = ops._FLASH
    monkeypatch.setattr(ops, "_FLASH", lambda *a, **k: (calls.append(a[0].shape), real(*a, **k))[1])
    gen = torch.Generator().manual_seed(4)
    bs, hq, hkv, d = 8, 4, 2, 16
    kc, vc = torch.randn(12, bs, hkv, d, generator=gen), torch.randn(12, bs, hkv, d, generator=gen)
    tables = torch.tensor([[1, 2, 5], [1, 2, 6]], dtype=torch.int32)
    query = torch.randn(6, hq, d, generator=gen)
    kw = dict(query_start_loc=torch.tensor([0, 3, 6], dtype=torch.int32), block_tables=tables, scale=d**-0.5)
    cached = dict(kw, seq_lens=torch.tensor([2 * bs + 3, 2 * bs + 3], dtype=torch.int32))
    got = paged_attention_torch(query, kc, vc, **cached)
    torch.testing.assert_close(got, paged_attention_ref(query, kc, vc, **cached), atol=1e-5, rtol=1e-4)
    assert calls == [(1, hkv, 6 * (hq // hkv), d), (2, hq, 3, d)]  # the shared part, both own parts
    calls.clear()
    fresh = dict(kw, seq_lens=torch.tensor([3, 3], dtype=torch.int32))  # whole prompts, nothing cached
    got = paged_attention_torch(query, kc, vc, **fresh)
    torch.testing.assert_close(got, paged_attention_ref(query, kc, vc, **fresh), atol=1e-5, rtol=1e-4)
    assert calls == []


def test_prefill_cascade_only_where_the_shared_part_dominates(monkeypatch):
    """With the real thresholds: 12 chunks of 10 new tokens behind 160 shared cached tokens take
    the cascade (and equal the reference); 4 such chunks, or 12 chunks of 40 new tokens, do not."""
    import kernels.torch_ops as ops

    taken = []
    real = ops._prefill_cascade
    monkeypatch.setattr(ops, "_prefill_cascade", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
    gen = torch.Generator().manual_seed(5)
    bs, hq, hkv, d, shared = 16, 9, 3, 64, 10

    def run(chunks: int, new: int) -> None:
        own = -(-new // bs)
        kc = torch.randn(shared + chunks * own, bs, hkv, d, generator=gen)
        vc = torch.randn(shared + chunks * own, bs, hkv, d, generator=gen)
        tables = torch.tensor([list(range(shared)) + [shared + c * own + j for j in range(own)]
                               for c in range(chunks)], dtype=torch.int32)
        query = torch.randn(chunks * new, hq, d, generator=gen)
        kw = dict(query_start_loc=torch.arange(0, chunks * new + 1, new, dtype=torch.int32),
                  seq_lens=torch.full((chunks,), shared * bs + new, dtype=torch.int32), block_tables=tables,
                  scale=d**-0.5)
        got = paged_attention_torch(query, kc, vc, **kw)
        torch.testing.assert_close(got, paged_attention_ref(query, kc, vc, **kw), atol=1e-5, rtol=1e-4)

    run(12, 10)
    run(4, 10)
    run(12, 40)
    assert taken == [True, False, False]


def test_prefill_cascade_falls_back_when_the_fused_kernel_refuses(monkeypatch, cascade_anywhere):
    """A RuntimeError from the fused kernel on a chunk's own part leaves ``out`` untouched and the
    plain path answers: the engine's step must not die of it."""
    import kernels.torch_ops as ops

    def refuse(*_a, **_k):
        raise RuntimeError("unsupported")

    monkeypatch.setattr(ops, "_own_parts", refuse)
    gen = torch.Generator().manual_seed(6)
    bs, hq, hkv, d = 8, 4, 2, 16
    kc, vc = torch.randn(12, bs, hkv, d, generator=gen), torch.randn(12, bs, hkv, d, generator=gen)
    kw = dict(query_start_loc=torch.tensor([0, 3, 6], dtype=torch.int32),
              block_tables=torch.tensor([[1, 2, 5], [1, 2, 6]], dtype=torch.int32), scale=d**-0.5,
              seq_lens=torch.tensor([2 * bs + 3, 2 * bs + 3], dtype=torch.int32))
    query = torch.randn(6, hq, d, generator=gen)
    got = paged_attention_torch(query, kc, vc, **kw)
    torch.testing.assert_close(got, paged_attention_ref(query, kc, vc, **kw), atol=1e-5, rtol=1e-4)
