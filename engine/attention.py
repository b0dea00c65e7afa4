"""What one forward's attention needs to find each token's context in the paged cache.

    flat batch:   | seq0: 1 token | seq1: 37 tokens (prefill chunk) | seq2: 1 token |
    query_start_loc = [0, 1, 38, 39]        seq_lens = context incl. the new tokens
    slot_mapping[i] = block_table[pos // block_size] * block_size + pos % block_size
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    max_query_len: int
    max_seq_len: int
    backend: str = "auto"
