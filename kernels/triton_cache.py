"""Triton kernel that writes the step's new K/V into the paged cache.

One program per new token: it reads the token's slot, and when the slot is not -1 copies the
token's ``[num_kv_heads, head_dim]`` K and V rows into
``cache[slot // block_size, slot % block_size]``. Strides are passed explicitly, so ``key`` and
``value`` may be views (e.g. slices of a fused QKV projection) and the cache may be any strided
``[num_blocks, block_size, num_kv_heads, head_dim]`` tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_PAD)[:, None]
    dims = tl.arange(0, DIM_PAD)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)

    k = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims * stride_kd, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims * stride_vd, mask=mask)
    k_dst = key_cache_ptr + block * stride_kcb + offset * stride_kcs + heads * stride_kch + dims * stride_kcd
    v_dst = value_cache_ptr + block * stride_vcb + offset * stride_vcs + heads * stride_vch + dims * stride_vcd
    tl.store(k_dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` at their slots.

    ``slot_mapping[i] = block_id * block_size + offset``; -1 skips token ``i``. Values are cast to
    the cache's dtype. Same contract as ``kernels.reference.write_kv_cache_ref``.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ in shape")
    if key_cache.shape[2:] != (num_kv_heads, head_dim) or value_cache.shape != key_cache.shape:
        raise ValueError(
            f"cache shape {tuple(key_cache.shape)} does not fit key {tuple(key.shape)}"
        )
    if slot_mapping.shape[0] < num_tokens:
        raise ValueError("slot_mapping is shorter than the number of tokens")
    if num_tokens == 0:
        return
    from kernels.triton_attention import require_runnable

    require_runnable(key.device, _write_kv_cache_kernel)
    _write_kv_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=key_cache.shape[1],
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        DIM_PAD=triton.next_power_of_2(head_dim),
    )
