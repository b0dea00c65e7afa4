"""The unified Triton paged-attention kernel against ``kernels.reference.paged_attention_ref``
(interpreter on CPU, real kernels on CUDA). Shapes are small so the interpreter stays fast; the
parametrisation covers each dtype, GQA ratio 1/3/4/8, block size 16/32, head dim 64/128 and the
split-KV path rather than their full cross product."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.reference import paged_attention_ref
from kernels.triton_attention import choose_num_splits, paged_attention_triton

# (dtype, num_q_heads, num_kv_heads, head_dim, block_size, q_lens, seq_lens, num_kv_splits)
# q_len == 1: decode; q_len == seq_len: whole prompt; otherwise a chunk over a cached prefix.
CASES = {
    "fp32-gqa3-smollm2-mixed": (torch.float32, 9, 3, 64, 16, [1, 7, 1, 21, 5], [37, 7, 16, 50, 83], 1),
    "fp16-mha-d128-bs32": (torch.float16, 4, 4, 128, 32, [1, 3, 40], [70, 40, 40], 1),
    "bf16-gqa4": (torch.bfloat16, 8, 2, 64, 16, [2, 1, 17], [19, 33, 60], 1),
    "fp32-gqa8-d128-bs32": (torch.float32, 8, 1, 128, 32, [1, 9, 1], [65, 9, 31], 1),
    "fp16-gqa3-d128-zero-len-seq": (torch.float16, 6, 2, 128, 16, [3, 0, 1], [45, 12, 1], 1),
    "split-fp32-gqa3-decode": (torch.float32, 9, 3, 64, 16, [1, 1, 1], [150, 33, 1], 4),
    "split-bf16-gqa8-bs32": (torch.bfloat16, 8, 1, 64, 32, [1, 1], [200, 97], 3),
    "split-fp16-gqa4-mixed": (torch.float16, 8, 2, 128, 16, [1, 6], [130, 70], 2),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_attention_matches_reference(case, paged_batch, atol):
    dtype, num_q_heads, num_kv_heads, head_dim, block_size, q_lens, seq_lens, splits = case
    batch = paged_batch(
        q_lens=q_lens, seq_lens=seq_lens, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, block_size=block_size, dtype=dtype,
    )
    out = paged_attention_triton(
        batch.query, batch.key_cache, batch.value_cache, **batch.kwargs(),
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), num_kv_splits=splits,
    )
    expected = paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, **batch.kwargs())

    assert out.shape == expected.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    err = (out.float() - expected.float()).abs().max().item()
    assert err <= atol[dtype], f"max |triton - reference| = {err:.3g} > {atol[dtype]}"


def test_split_and_unsplit_agree_and_hints_are_optional(paged_batch, atol):
    """The same decode batch through 1 and 5 partitions, with the host hints left out (read from
    the tensors), gives the same result."""
    batch = paged_batch(
        q_lens=[1, 1, 1, 1], seq_lens=[5, 129, 64, 90], num_q_heads=4, num_kv_heads=2, head_dim=64,
        block_size=16, dtype=torch.float32, seed=3,
    )
    one = paged_attention_triton(batch.query, batch.key_cache, batch.value_cache, **batch.kwargs(),
                                 num_kv_splits=1)
    five = paged_attention_triton(batch.query, batch.key_cache, batch.value_cache, **batch.kwargs(),
                                  num_kv_splits=5)
    assert (one - five).abs().max().item() <= atol[torch.float32]


def test_strided_query_through_dispatch(paged_batch, atol):
    """Q as a slice of a fused QKV output (non-contiguous), via ``kernels.paged_attention``."""
    batch = paged_batch(
        q_lens=[4, 1], seq_lens=[20, 9], num_q_heads=9, num_kv_heads=3, head_dim=64, block_size=16,
        dtype=torch.float16, seed=5,
    )
    num_tokens, num_q_heads, head_dim = batch.query.shape
    fused = torch.randn(num_tokens, (num_q_heads + 6) * head_dim, device=batch.query.device).to(torch.float16)
    query = fused[:, : num_q_heads * head_dim].view(num_tokens, num_q_heads, head_dim)
    query.copy_(batch.query)
    assert not query.is_contiguous()

    out = kernels.paged_attention(query, batch.key_cache, batch.value_cache, **batch.kwargs(), backend="triton")
    expected = paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, **batch.kwargs())
    assert (out.float() - expected.float()).abs().max().item() <= atol[torch.float16]


def test_rejects_head_counts_that_do_not_group(paged_batch):
    batch = paged_batch(q_lens=[1], seq_lens=[4], num_q_heads=4, num_kv_heads=4, head_dim=64, block_size=16,
                        dtype=torch.float32)
    bad_cache = batch.key_cache[:, :, :3]
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention_triton(batch.query, bad_cache, bad_cache, **batch.kwargs())


@pytest.mark.parametrize(
    ("num_seqs", "num_kv_heads", "max_query_len", "max_seq_len", "expected"),
    [
        (1, 8, 1, 8192, 32),  # one long decode on 132 SMs: split as far as the cap allows
        (4, 3, 1, 2048, 8),  # limited by keys per partition (2048 // 256)
        (64, 8, 1, 8192, 1),  # 512 (seq, head) pairs already fill the GPU
        (1, 8, 1, 300, 1),  # too short: one partition would hold < 2 x 256 keys
        (1, 8, 16, 8192, 1),  # prefill chunks have enough query tiles
    ],
)
def test_split_heuristic(num_seqs, num_kv_heads, max_query_len, max_seq_len, expected):
    got = choose_num_splits(num_seqs=num_seqs, num_kv_heads=num_kv_heads, max_query_len=max_query_len,
                            max_seq_len=max_seq_len, sm_count=132)
    assert got == expected


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_ragged_batches(seed, paged_batch, atol):
    """Random mixes of decodes, whole prompts and chunks, random GQA ratio, dtype, block size and
    split count: the same answer as the reference."""
    rng = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=rng))]

    num_kv_heads, group = pick([(1, 8), (2, 3), (2, 4), (3, 1)])
    dtype = pick([torch.float32, torch.float16, torch.bfloat16])
    seq_lens = torch.randint(1, 90, (int(torch.randint(1, 6, (1,), generator=rng)),), generator=rng).tolist()
    q_lens = [pick([1, 1, s, max(1, s // 3)]) for s in seq_lens]
    batch = paged_batch(
        q_lens=q_lens, seq_lens=seq_lens, num_q_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
        head_dim=pick([64, 128]), block_size=pick([16, 32]), dtype=dtype, seed=seed,
    )
    out = paged_attention_triton(batch.query, batch.key_cache, batch.value_cache, **batch.kwargs(),
                                 num_kv_splits=pick([1, 1, 3]))
    expected = paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, **batch.kwargs())
    assert (out.float() - expected.float()).abs().max().item() <= atol[dtype]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="long contexts are too slow for the interpreter")
@pytest.mark.parametrize(
    ("num_q_heads", "num_kv_heads", "head_dim", "q_lens", "seq_lens"),
    [
        (32, 8, 128, [1, 1], [5000, 3111]),  # few long decodes: the heuristic splits
        (9, 3, 64, [1, 300, 1], [4097, 1000, 77]),  # a long chunk over a prefix among decodes
        (32, 8, 128, [1] * 200, [700] * 200),  # many decodes: no split
    ],
)
def test_long_contexts_on_cuda(num_q_heads, num_kv_heads, head_dim, q_lens, seq_lens, paged_batch, atol):
    batch = paged_batch(q_lens=q_lens, seq_lens=seq_lens, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                        head_dim=head_dim, block_size=16, dtype=torch.bfloat16)
    out = kernels.paged_attention(batch.query, batch.key_cache, batch.value_cache, **batch.kwargs(),
                                  max_query_len=max(q_lens), max_seq_len=max(seq_lens))
    expected = paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, **batch.kwargs())
    assert (out.float() - expected.float()).abs().max().item() <= atol[torch.bfloat16]
