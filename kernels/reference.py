"""Plain-torch reference for the paged-attention operations: the CPU path's oracle.

Layout of one layer's cache (K and V alike)::

    cache[num_blocks, block_size, num_kv_heads, head_dim]
    slot = block_id * block_size + offset_in_block

A sequence's block table lists its blocks in order; token ``t`` of the sequence lives in
slot ``block_table[t // block_size] * block_size + t % block_size``.

Written for clarity, not speed: every other implementation is tested against this one.
"""

from __future__ import annotations

import torch


def write_kv_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each new token's K/V at its slot; a slot of -1 means skip that token."""
    num_blocks, block_size = key_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    kc = key_cache.view(num_blocks * block_size, *key_cache.shape[2:])
    vc = value_cache.view(num_blocks * block_size, *value_cache.shape[2:])
    kc[slots] = key[keep].to(kc.dtype)
    vc[slots] = value[keep].to(vc.dtype)


def paged_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    *,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a flat ragged batch of queries over paged K/V.

    Args:
        query: ``[num_tokens, num_q_heads, head_dim]``, the new tokens of every sequence, concatenated.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, already holding
            the new tokens' K/V.
        query_start_loc: ``[num_seqs + 1]``, cumulative query lengths (``0, q0, q0+q1, ...``).
        seq_lens: ``[num_seqs]``, context length of each sequence *including* its new tokens.
        block_tables: ``[num_seqs, max_blocks_per_seq]``; entries past a sequence's length are ignored.
        scale: softmax scale, usually ``head_dim ** -0.5``.

    Returns:
        ``[num_tokens, num_q_heads, head_dim]`` in the query's dtype. The ``j``-th new token of a
        sequence with ``q`` new tokens and context ``L`` sits at position ``L - q + j`` and attends to
        positions ``0 .. L - q + j``.
    """
    num_tokens, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        n_blocks = (seq_len + block_size - 1) // block_size
        blocks = block_tables[i, :n_blocks].long()
        k = key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].float()
        v = value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len].float()
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        q = query[q_start:q_end].float()  # [q, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        k_pos = torch.arange(seq_len, device=query.device)
        mask = k_pos[None, :] > q_pos[:, None]
        scores.masked_fill_(mask[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out
