"""The torch path of the kernel operations (CPU fast path). Starts as the reference; the engine
work replaces it with faster code that stays equal to ``kernels.reference``."""

from __future__ import annotations

import torch

from kernels.reference import paged_attention_ref, write_kv_cache_ref


def write_kv_cache_torch(key, value, key_cache, value_cache, slot_mapping) -> None:
    write_kv_cache_ref(key, value, key_cache, value_cache, slot_mapping)


def paged_attention_torch(
    query, key_cache, value_cache, *, query_start_loc, seq_lens, block_tables, scale,
    max_query_len: int | None = None, max_seq_len: int | None = None,
) -> torch.Tensor:
    return paged_attention_ref(
        query, key_cache, value_cache,
        query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=block_tables, scale=scale,
    )
