"""Fixtures for the kernel tests.

Without CUDA the Triton kernels run under the Triton interpreter: ``TRITON_INTERPRET`` must be set
before ``triton.jit`` decorates them (it picks the interpreter at decoration time), so it is set here,
before any test module imports ``kernels.triton_*``. With CUDA the real kernels run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# max |triton - reference| allowed, per dtype (inputs ~N(0, 1), outputs are convex mixes of V rows)
ATOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@dataclass(slots=True)
class PagedBatch:
    """A flat ragged batch over a paged cache whose blocks are handed out in shuffled order."""

    query: torch.Tensor  # [num_tokens, num_q_heads, head_dim]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]; unused entries hold -1
    scale: float

    def kwargs(self) -> dict:
        return dict(
            query_start_loc=self.query_start_loc, seq_lens=self.seq_lens,
            block_tables=self.block_tables, scale=self.scale,
        )


def make_paged_batch(
    *,
    q_lens: Sequence[int],
    seq_lens: Sequence[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int = 0,
) -> PagedBatch:
    """Random Q/K/V; sequence ``i`` has ``seq_lens[i]`` cached tokens, the last ``q_lens[i]`` of which
    are this step's queries. Block tables draw from a shuffled pool with spare blocks, so pages are
    neither contiguous nor in order, and table rows are padded with -1."""
    assert all(0 <= q <= s for q, s in zip(q_lens, seq_lens, strict=True))
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    value_cache = torch.randn(cache_shape, generator=gen).to(dtype)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    block_tables = torch.full((len(seq_lens), max(blocks_per_seq) + 1), -1, dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = torch.tensor(pool[:n], dtype=torch.int32)
        pool = pool[n:]
    query = torch.randn((sum(q_lens), num_q_heads, head_dim), generator=gen).to(dtype)
    starts = [0]
    for q in q_lens:
        starts.append(starts[-1] + q)
    return PagedBatch(
        query=query.to(DEVICE),
        key_cache=key_cache.to(DEVICE),
        value_cache=value_cache.to(DEVICE),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=DEVICE),
        block_tables=block_tables.to(DEVICE),
        scale=head_dim**-0.5,
    )


@pytest.fixture
def paged_batch() -> Callable[..., PagedBatch]:
    return make_paged_batch


@pytest.fixture
def device() -> torch.device:
    return DEVICE


@pytest.fixture
def atol() -> dict[torch.dtype, float]:
    return ATOL
