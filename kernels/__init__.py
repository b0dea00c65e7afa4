"""Attention and cache-write operations on the paged KV cache: one public function per operation.

The engine calls only these. ``backend`` picks the implementation:

- ``"auto"``   Triton kernels on CUDA tensors; on the CPU the native path when its C kernel
  builds here, else the torch path;
- ``"native"`` decode rows through the C kernel (``kernels.native``, compiled at first use),
  prefill chunks through the torch path;
- ``"torch"``  the plain-torch path (``kernels.torch_ops``): fused SDPA over gathered blocks;
- ``"triton"`` the Triton kernels (on the CPU only under ``TRITON_INTERPRET=1``, for tests).

``kernels.reference`` holds the simple oracle every implementation is tested against.
"""

from __future__ import annotations

import torch

BACKENDS = ("auto", "torch", "native", "triton")


def resolve_backend(backend: str, device: torch.device) -> str:
    """The concrete backend ``auto`` stands for on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {BACKENDS}")
    if backend == "auto":
        if device.type == "cuda":
            return "triton"
        from kernels import native

        return "native" if native.available() else "torch"
    return backend



def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: str = "auto",
) -> None:
    """Store the K/V of the step's new tokens ``[num_tokens, num_kv_heads, head_dim]`` into their
    cache slots (``slot_mapping[i] = block_id * block_size + offset``; -1 skips the token)."""
    if resolve_backend(backend, key.device) == "triton":
        from kernels.triton_cache import write_kv_cache_triton

        write_kv_cache_triton(key, value, key_cache, value_cache, slot_mapping)
    else:
        from kernels.torch_ops import write_kv_cache_torch

        write_kv_cache_torch(key, value, key_cache, value_cache, slot_mapping)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    *,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Causal attention of a flat ragged batch (decodes and prefill chunks together) over the
    paged cache. Shapes and semantics: see ``kernels.reference.paged_attention_ref``.
    ``max_query_len`` / ``max_seq_len`` are optional hints (host ints) that spare a device sync."""
    resolved = resolve_backend(backend, query.device)
    if resolved == "triton":
        from kernels.triton_attention import paged_attention_triton

        return paged_attention_triton(
            query, key_cache, value_cache,
            query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=block_tables,
            scale=scale, max_query_len=max_query_len, max_seq_len=max_seq_len,
        )
    from kernels.torch_ops import paged_attention_torch

    decode_fn = None
    if resolved == "native":
        from kernels import native

        if native.supports(query, key_cache) and native.available():
            decode_fn = native.paged_decode
    return paged_attention_torch(
        query, key_cache, value_cache,
        query_start_loc=query_start_loc, seq_lens=seq_lens, block_tables=block_tables,
        scale=scale, max_query_len=max_query_len, max_seq_len=max_seq_len, decode_fn=decode_fn,
    )
