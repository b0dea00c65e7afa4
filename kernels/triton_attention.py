"""Unified paged attention in Triton: decodes and prefill chunks of a flat ragged batch in one launch.

Work split (one program per cell of the grid)::

    grid = (query tiles, num_kv_heads, num_splits)

    query tile  = up to BLOCK_Q consecutive new tokens of ONE sequence
    rows (M)    = BLOCK_Q tokens x GROUP_PAD query heads of one KV head's group
                  row r -> token r // GROUP_PAD, head kv_head * GROUP + r % GROUP_PAD
    keys (N)    = the sequence's cached positions, TILE_N at a time, gathered
                  through the block table (a tile may span several pages)

Each K/V tile is loaded once and used by every query head of its group (GQA): the group is stacked
in the tile's rows, padded to a power of two and masked (SmolLM2's 3 heads per group -> 4 rows).
Scores and the softmax run in fp32 with the online (running max / running sum) update; both
products go through ``tl.dot``, so every dimension is padded to at least 16.

Query tiles are numbered without a host-side table: sequence ``i`` owns the tiles starting at
``query_start_loc[i] // BLOCK_Q + i``; a program finds its sequence by binary search over that
increasing sequence, and the grid is the upper bound ``num_tokens // BLOCK_Q + num_seqs`` (spare
programs return at once).

Split-KV: when few (sequence, KV head) pairs face long contexts, the GPU would sit mostly idle, so
each tile's key range is cut into ``num_splits`` partitions, each program writes an unnormalised
partial result (running max, sum, accumulator) and ``_reduce_splits_kernel`` merges them.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

_MIN_SPLIT_LEN = 256  # keys per partition below which splitting costs more than it gains
_MAX_SPLITS = 32


@triton.jit
def _find_sequence(query_start_loc_ptr, num_seqs, tile, BLOCK_Q: tl.constexpr):
    """Largest ``i`` with ``query_start_loc[i] // BLOCK_Q + i <= tile`` (binary search)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["num_seqs", "split_len"])
def _paged_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    part_acc_ptr, part_max_ptr, part_sum_ptr,
    scale_log2, num_seqs, split_len,
    stride_qt, stride_qh, stride_qd,
    stride_ot, stride_oh, stride_od,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_bt,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq = _find_sequence(query_start_loc_ptr, num_seqs, tile, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile_in_seq = tile - (q_start // BLOCK_Q + seq)
    if tile_in_seq * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len  # cached positions before this step's tokens

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    rows = tl.arange(0, BLOCK_M)
    q_tok = tile_in_seq * BLOCK_Q + rows // GROUP_PAD  # index among the sequence's new tokens
    head_in_group = rows % GROUP_PAD
    row_valid = (q_tok < q_len) & (head_in_group < GROUP)
    q_head = kv_head * GROUP + head_in_group
    token = (q_start + q_tok).to(tl.int64)
    dims = tl.arange(0, DIM_PAD)
    dim_valid = dims < HEAD_DIM
    q_pos = prefix_len + q_tok  # absolute position: attends to keys 0 .. q_pos

    q = tl.load(
        q_ptr + token[:, None] * stride_qt + q_head[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=row_valid[:, None] & dim_valid[None, :], other=0.0,
    )
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    # Causal bound of the tile's last token; a split covers one slice of [0, kv_end).
    kv_end = tl.minimum(seq_len, prefix_len + (tile_in_seq + 1) * BLOCK_Q)
    kv_lo = 0
    kv_hi = kv_end
    if NUM_SPLITS > 1:
        kv_lo = split * split_len
        kv_hi = tl.minimum(kv_end, kv_lo + split_len)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_head = k_cache_ptr + kv_head.to(tl.int64) * stride_kh
    v_head = v_cache_ptr + kv_head.to(tl.int64) * stride_vh

    for start in range(kv_lo, kv_hi, TILE_N):
        k_pos = start + tl.arange(0, TILE_N)
        k_valid = k_pos < kv_hi
        block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_valid, other=0).to(tl.int64)
        in_block = (k_pos % BLOCK_SIZE).to(tl.int64)
        k = tl.load(  # [DIM_PAD, TILE_N], already transposed for Q @ K^T
            k_head + block[None, :] * stride_kb + in_block[None, :] * stride_ks + dims[:, None] * stride_kd,
            mask=dim_valid[:, None] & k_valid[None, :], other=0.0,
        )
        v = tl.load(  # [TILE_N, DIM_PAD]
            v_head + block[:, None] * stride_vb + in_block[:, None] * stride_vs + dims[None, :] * stride_vd,
            mask=k_valid[:, None] & dim_valid[None, :], other=0.0,
        )
        if DOT_IN_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2  # log2 domain
        allowed = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: no NaN
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + token[:, None] * stride_ot + q_head[:, None] * stride_oh + dims[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & dim_valid[None, :],
        )
    else:
        part = (token * NUM_Q_HEADS + q_head) * NUM_SPLITS + split  # [tokens, heads, splits]
        tl.store(part_max_ptr + part, m_i, mask=row_valid)
        tl.store(part_sum_ptr + part, l_i, mask=row_valid)
        tl.store(part_acc_ptr + part[:, None] * DIM_PAD + dims[None, :], acc, mask=row_valid[:, None])


@triton.jit
def _reduce_splits_kernel(
    out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    stride_ot, stride_oh, stride_od,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    split_valid = splits < NUM_SPLITS
    dims = tl.arange(0, DIM_PAD)
    part = (token * NUM_Q_HEADS + head) * NUM_SPLITS + splits
    m = tl.load(part_max_ptr + part, mask=split_valid, other=float("-inf"))
    sums = tl.load(part_sum_ptr + part, mask=split_valid, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * DIM_PAD + dims[None, :], mask=split_valid[:, None], other=0.0)
    m_max = tl.max(m, 0)  # finite: split 0 always holds key 0
    w = tl.exp2(m - m_max)  # empty splits (m = -inf) weigh 0
    out = tl.sum(acc * w[:, None], 0) / tl.sum(sums * w, 0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + dims * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


def require_runnable(device: torch.device, kernel) -> None:
    """Triton runs CPU tensors only in its interpreter, which it picks when ``triton.jit`` decorates
    a kernel: fail clearly rather than deep inside the launcher."""
    if device.type != "cuda" and type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError(
            f"the Triton kernels got {device.type} tensors but were compiled for a GPU; on a CPU set "
            "TRITON_INTERPRET=1 before kernels.triton_* is imported (tests only), or use backend='torch'"
        )


def choose_num_splits(*, num_seqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int,
                      sm_count: int) -> int:
    """How many KV partitions pay for a batch: > 1 only for decode-only batches whose
    (sequence, KV head) pairs cannot fill the ``sm_count`` multiprocessors and whose contexts are
    long enough that each partition still reads at least ``_MIN_SPLIT_LEN`` keys."""
    work = num_seqs * num_kv_heads
    if max_query_len != 1 or work >= sm_count:
        return 1
    splits = min(_MAX_SPLITS, max_seq_len // _MIN_SPLIT_LEN, triton.cdiv(2 * sm_count, work))
    return splits if splits >= 2 else 1


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 0  # the interpreter: never split unless asked
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _tile_sizes(group_pad: int, dim_pad: int, max_query_len: int) -> tuple[int, int]:
    """(BLOCK_Q, TILE_N): at least 16 rows for tl.dot; up to 64 rows for prefill chunks."""
    min_q = max(1, 16 // group_pad)
    max_q = max(min_q, 64 // group_pad)
    block_q = max(min_q, min(max_q, triton.next_power_of_2(max(1, max_query_len))))
    tile_n = 64 if dim_pad <= 64 else 32
    return block_q, tile_n


def paged_attention_triton(
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
    num_kv_splits: int | None = None,
) -> torch.Tensor:
    """Causal attention of a flat ragged batch over the paged cache (contract:
    ``kernels.reference.paged_attention_ref``).

    ``max_query_len`` / ``max_seq_len`` are host-int hints; when missing they are read from the
    tensors (one device sync). ``num_kv_splits`` forces the number of KV partitions (1 = never
    split); ``None`` lets ``choose_num_splits`` decide.
    """
    num_tokens, num_q_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, cache_dim = key_cache.shape
    if cache_dim != head_dim or num_q_heads % num_kv_heads:
        raise ValueError(
            f"query {tuple(query.shape)} does not fit cache {tuple(key_cache.shape)} "
            "(head_dim must match, num_q_heads must be a multiple of num_kv_heads)"
        )
    require_runnable(query.device, _paged_attention_kernel)
    num_seqs = seq_lens.shape[0]
    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=query.dtype, device=query.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())

    group = num_q_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    block_q, tile_n = _tile_sizes(group_pad, dim_pad, max_query_len)
    num_splits = num_kv_splits or choose_num_splits(
        num_seqs=num_seqs, num_kv_heads=num_kv_heads, max_query_len=max_query_len,
        max_seq_len=max_seq_len, sm_count=_sm_count(query.device),
    )
    num_splits = max(1, min(num_splits, triton.cdiv(max_seq_len, tile_n)))
    split_len = triton.cdiv(triton.cdiv(max_seq_len, num_splits), tile_n) * tile_n

    if num_splits > 1:
        part_acc = torch.empty((num_tokens, num_q_heads, num_splits, dim_pad), dtype=torch.float32,
                               device=query.device)
        part_max = torch.empty((num_tokens, num_q_heads, num_splits), dtype=torch.float32, device=query.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # unused placeholders

    grid = (num_tokens // block_q + num_seqs, num_kv_heads, num_splits)
    _paged_attention_kernel[grid](
        out, query, key_cache, value_cache,
        block_tables, seq_lens, query_start_loc,
        part_acc, part_max, part_sum,
        scale * math.log2(math.e), num_seqs, split_len,
        *query.stride(), *out.stride(), *key_cache.stride(), *value_cache.stride(),
        block_tables.stride(0),
        NUM_Q_HEADS=num_q_heads,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        TILE_N=tile_n,
        NUM_SPLITS=num_splits,
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        # The interpreter's tl.dot multiplies bf16 bit patterns (triton-lang/triton#11584).
        DOT_IN_FP32=query.dtype == torch.bfloat16 and query.device.type != "cuda",
        num_warps=4,
    )
    if num_splits > 1:
        _reduce_splits_kernel[(num_tokens, num_q_heads)](
            out, part_acc, part_max, part_sum,
            *out.stride(),
            NUM_Q_HEADS=num_q_heads,
            HEAD_DIM=head_dim,
            DIM_PAD=dim_pad,
            NUM_SPLITS=num_splits,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out
