"""The Triton cache-write kernel against ``kernels.reference.write_kv_cache_ref``
(interpreter on CPU, real kernel on CUDA)."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.reference import write_kv_cache_ref
from kernels.triton_cache import write_kv_cache_triton


def _caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, device):
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape).to(dtype).to(device)
    value_cache = torch.randn(shape).to(dtype).to(device)
    return key_cache, value_cache


@pytest.mark.parametrize(
    ("dtype", "block_size", "num_kv_heads", "head_dim"),
    [
        (torch.float32, 16, 3, 64),
        (torch.float16, 32, 2, 128),
        (torch.bfloat16, 16, 1, 64),
        (torch.float32, 16, 3, 80),  # head_dim not a power of two
    ],
)
def test_write_matches_reference_and_skips_minus_one(dtype, block_size, num_kv_heads, head_dim, device):
    torch.manual_seed(0)
    num_blocks, num_tokens = 5, 12
    key = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype).to(device)
    value = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype).to(device)
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[[1, 4, 9]] = -1  # padding tokens
    slots = slots.to(device)
    key_cache, value_cache = _caches(num_blocks, block_size, num_kv_heads, head_dim, dtype, device)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()

    write_kv_cache_triton(key, value, key_cache, value_cache, slots)
    write_kv_cache_ref(key, value, expected_k, expected_v, slots)

    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)
    # the skipped tokens' values landed nowhere: every written slot holds a kept token
    flat_k = key_cache.view(-1, num_kv_heads, head_dim)
    kept = slots >= 0
    assert torch.equal(flat_k[slots[kept].long()], key[kept])


def test_write_from_strided_views_and_casts_to_cache_dtype(device):
    """K and V as slices of a fused QKV output (non-contiguous), written into a bf16 cache."""
    torch.manual_seed(1)
    num_tokens, num_q_heads, num_kv_heads, head_dim, block_size = 7, 6, 2, 64, 16
    qkv = torch.randn(num_tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, device=device)
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    key = qkv[:, q_size:q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, q_size + kv_size:].view(num_tokens, num_kv_heads, head_dim)
    assert not key.is_contiguous()
    slots = torch.tensor([0, 17, 18, -1, 5, 40, 63], dtype=torch.int32, device=device)
    key_cache, value_cache = _caches(4, block_size, num_kv_heads, head_dim, torch.bfloat16, device)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()

    kernels.write_kv_cache(key, value, key_cache, value_cache, slots, backend="triton")
    write_kv_cache_ref(key, value, expected_k, expected_v, slots)

    # within one bf16 ulp: the interpreter's fp32 -> bf16 cast rounds differently from torch's
    torch.testing.assert_close(key_cache, expected_k, rtol=2**-7, atol=0)
    torch.testing.assert_close(value_cache, expected_v, rtol=2**-7, atol=0)
    untouched = torch.ones(4 * 16, dtype=torch.bool)
    untouched[slots[slots >= 0].long().cpu()] = False
    flat = key_cache.view(-1, num_kv_heads, head_dim)
    assert torch.equal(flat[untouched.to(device)], expected_k.view(-1, num_kv_heads, head_dim)[untouched.to(device)])


def test_write_of_no_tokens_changes_nothing(device):
    key_cache, value_cache = _caches(2, 16, 1, 64, torch.float32, device)
    before = key_cache.clone()
    empty = torch.empty(0, 1, 64, device=device)
    write_kv_cache_triton(empty, empty, key_cache, value_cache, torch.empty(0, dtype=torch.long, device=device))
    assert torch.equal(key_cache, before)


def test_write_rejects_mismatched_shapes(device):
    key_cache, value_cache = _caches(2, 16, 2, 64, torch.float32, device)
    key = torch.randn(3, 1, 64, device=device)
    with pytest.raises(ValueError, match="does not fit"):
        write_kv_cache_triton(key, key, key_cache, value_cache, torch.zeros(3, dtype=torch.long, device=device))
