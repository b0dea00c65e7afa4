"""The torch path of the kernel operations: the CPU fast path, equal to ``kernels.reference``
(up to float rounding; tested in ``tests/kernels/test_torch_ops.py``).

Attention splits the flat batch in two:

- decodes (one new token per sequence) run as ONE batched attention: the context of every
  sequence is gathered through the block tables (one ``index_select`` of whole blocks) into
  ``[B, L, Hkv, D]`` and attended by torch's fused CPU flash kernel on strided views; the ``G`` query
  heads of each KV head are laid out as ``G`` "query rows", so grouped-query attention needs no
  repeated K/V and no causal mask, only a length mask. Leading blocks that every sequence
  shares (a common system prompt) are attended once for the batch and merged by log-sum-exp;
- prefill chunks run one sequence at a time through ``scaled_dot_product_attention``, causal
  with the chunk's offset into its context (``is_causal`` when there is no earlier context);
  when several chunks sit behind the same cached leading blocks (requests sharing a system
  prompt), those blocks are attended once for all of them and merged the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.reference import write_kv_cache_ref


def write_kv_cache_torch(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Scatter the new tokens' K/V into their slots (``index_copy_`` into the flat cache)."""
    if slot_mapping.numel() == 0:
        return
    if bool((slot_mapping < 0).any()):
        write_kv_cache_ref(key, value, key_cache, value_cache, slot_mapping)
        return
    slots = slot_mapping.long()
    kc = key_cache.view(-1, *key_cache.shape[2:])
    vc = value_cache.view(-1, *value_cache.shape[2:])
    kc.index_copy_(0, slots, key.to(kc.dtype))
    vc.index_copy_(0, slots, value.to(vc.dtype))


def paged_attention_torch(
    query, key_cache, value_cache, *, query_start_loc, seq_lens, block_tables, scale,
    max_query_len: int | None = None, max_seq_len: int | None = None, decode_fn=None,
) -> torch.Tensor:
    """Same contract as ``kernels.reference.paged_attention_ref``; the hints spare host syncs.
    ``decode_fn(query, key_cache, value_cache, seq_lens, block_tables, scale, max_seq_len)`` replaces
    the torch decode path for the one-token rows (the native CPU kernel plugs in here)."""
    num_seqs = seq_lens.shape[0]
    if num_seqs == 0 or query.shape[0] == 0:
        return torch.empty_like(query)
    decode_fn = decode_fn or _decode
    if max_query_len == 1:
        return decode_fn(query, key_cache, value_cache, seq_lens, block_tables, scale, max_seq_len)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    q_lens = [starts[i + 1] - starts[i] for i in range(num_seqs)]
    out = torch.empty_like(query)
    decode = [i for i, n in enumerate(q_lens) if n == 1]
    if decode:
        rows = torch.tensor([starts[i] for i in decode], device=query.device)
        idx = torch.tensor(decode, device=query.device)
        d_out = decode_fn(
            query.index_select(0, rows), key_cache, value_cache, seq_lens.index_select(0, idx),
            block_tables.index_select(0, idx), scale, max(lens[i] for i in decode),
        )
        out.index_copy_(0, rows, d_out)
    prefill = [i for i, n in enumerate(q_lens) if n > 1]
    if len(prefill) > 1 and _prefill_cascade(query, key_cache, value_cache, block_tables, prefill, starts, q_lens,
                                             lens, scale, out):
        return out
    for i in prefill:
        s, n = starts[i], q_lens[i]
        out[s : s + n] = _prefill(query[s : s + n], key_cache, value_cache, block_tables[i], lens[i], scale)
    return out


def _gather(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """``[B, num_blocks * block_size, Hkv, D]``: each sequence's first blocks, in order."""
    # entries past a sequence's length may be padding (even -1): clamp, the length mask hides them.
    # index_select over whole blocks (one memcpy per block) is far cheaper than advanced indexing
    idx = block_tables[:, :num_blocks].reshape(-1).long().clamp_(min=0)
    g = cache.view(cache.shape[0], -1).index_select(0, idx)
    return g.view(block_tables.shape[0], -1, *cache.shape[2:])


def _decode(query, key_cache, value_cache, seq_lens, block_tables, scale, max_seq_len) -> torch.Tensor:
    """One new token per sequence. Leading blocks shared by every sequence (a common system
    prompt) are attended once for the whole batch ("cascade"); each sequence's own blocks are
    gathered and attended batched; the two parts merge through their log-sum-exp."""
    b, hq, d = query.shape
    bs, hkv = key_cache.shape[1], key_cache.shape[2]
    g = hq // hkv
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    nb = -(-max_seq_len // bs)
    tables = block_tables[:, :nb]
    shared = _num_shared_blocks(tables, seq_lens, bs) if b > 1 else 0
    q = query.view(b, hkv, g, d)  # the group's query heads as rows: GQA without repeated K/V
    parts = []
    if shared:
        blocks = tables[0, :shared].long()
        k = key_cache.index_select(0, blocks).view(-1, hkv, d).permute(1, 2, 0)  # [Hkv, D, Lp]
        v = value_cache.index_select(0, blocks).view(-1, hkv, d).transpose(0, 1)  # [Hkv, Lp, D]
        qs = q.transpose(0, 1).reshape(hkv, b * g, d)  # [Hkv, B*G, D]
        m, s, o = _partial(torch.matmul(qs, k.to(q.dtype)), v.to(q.dtype), scale, None)
        parts.append((m.view(hkv, b, g).transpose(0, 1), s.view(hkv, b, g).transpose(0, 1),
                      o.view(hkv, b, g, d).transpose(0, 1)))
    if shared < nb:
        k = _gather(key_cache, tables[:, shared:], nb - shared).to(q.dtype)  # [B, Ls, Hkv, D]
        v = _gather(value_cache, tables[:, shared:], nb - shared).to(q.dtype)
        positions = torch.arange(shared * bs, nb * bs, device=query.device)
        mask = (positions[None, :] >= seq_lens[:, None]).view(b, 1, 1, -1)
        parts.append(_private_attention(q, k, v, mask, scale))
    if len(parts) == 1:
        _, s, o = parts[0]
        return (o / s.unsqueeze(-1)).reshape(b, hq, d).to(query.dtype)
    (m1, l1, o1), (m2, l2, o2) = parts
    m = torch.maximum(m1, m2)
    w1, w2 = torch.exp(m1 - m), torch.exp(m2 - m)
    out = (o1 * w1.unsqueeze(-1) + o2 * w2.unsqueeze(-1)) / (l1 * w1 + l2 * w2).unsqueeze(-1)
    return out.reshape(b, hq, d).to(query.dtype)


def _partial(scores, v, scale, mask):
    """Unnormalised softmax attention over part of the context: (row max, row sum, sum p*v)."""
    m, s, p = _softmax_parts(scores, scale, mask)
    return m, s, torch.matmul(p.to(v.dtype), v).float()


_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _private_attention(q, k, v, mask, scale):
    """Decode attention of ``q [B, Hkv, G, D]`` over gathered ``k``/``v [B, L, Hkv, D]`` with a
    length ``mask [B, 1, 1, L]`` (True = hidden). Returns (row max, row sum, sum p*v) partials.
    Fast path: torch's fused CPU flash kernel on strided views (no copies, returns the
    log-sum-exp, i.e. partials with row max = lse and row sum = 1); fallback: one bmm per head."""
    if _FLASH is not None and q.device.type == "cpu":
        try:
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(mask, float("-inf"))
            out, lse = _FLASH(q, k.transpose(1, 2), v.transpose(1, 2), 0.0, False, attn_mask=bias, scale=scale)
            empty = mask.all(dim=-1)  # [B, 1, 1]: a row with no visible token weighs 0 in the merge
            lse = lse.float().masked_fill(empty, float("-inf"))
            out = out.float().masked_fill(empty.unsqueeze(-1), 0.0)
            return lse, torch.ones_like(lse), out
        except RuntimeError:
            pass
    scores = torch.stack([torch.bmm(q[:, h], k[:, :, h].transpose(1, 2)) for h in range(k.shape[2])], dim=1)
    m, s, p = _softmax_parts(scores, scale, mask)  # p [B, Hkv, G, L]
    o = torch.stack([torch.bmm(p[:, h].to(v.dtype), v[:, :, h]) for h in range(k.shape[2])], dim=1)
    return m, s, o.float()


def _softmax_parts(scores, scale, mask):
    """(row max, row sum, unnormalised probabilities) of ``scores * scale`` (masked: -inf)."""
    scores = scores.float() * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    m = scores.amax(dim=-1)  # -inf for a fully masked row: it then weighs 0 in the merge
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(scores - m_safe.unsqueeze(-1))
    return m, p.sum(dim=-1), p


def _num_shared_blocks(tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> int:
    """Leading block columns identical in every row and full in every sequence."""
    same = (tables == tables[:1]).all(dim=0).int().cumprod(dim=0).sum()
    full = int(seq_lens.min()) // block_size
    return min(int(same), full)


# The prefill cascade pays off when many chunks share a prefix much longer than their own parts
# (measured on 2 cores against the plain path: 50 chunks of 14 new tokens behind 160-1,008 shared
# ones 2.4-3.1x, 16 such chunks 1.8-2.1x, 4 chunks 1.0-1.3x; chunks of 60 new tokens: behind 32
# shared 0.5-0.6x, behind 320 0.8-1.06x, behind 640 0.96-1.32x).
CASCADE_MIN_CHUNKS = 8
CASCADE_MIN_SHARED = 128  # tokens
CASCADE_MIN_RATIO = 8  # shared tokens per token of a chunk's own context


def _prefill_cascade(query, key_cache, value_cache, block_tables, prefill, starts, q_lens, lens, scale,
                     out) -> bool:
    """Prefill chunks over a common cached prefix (requests of one tenant sharing a system prompt,
    prefix-cache hits): the leading blocks that every chunk's table shares, and that lie wholly
    before every chunk's first new token, are gathered once and attended by all the chunks' queries
    in one fused call (no mask: every query comes after them); each chunk's own blocks are attended
    causally, together in one padded call; the two parts merge through their log-sum-exp. Writes ``out`` and
    returns True, or returns False for the plain path: too little shared (``CASCADE_MIN_*``), or
    no fused CPU kernel.

    Without it, each of 50 requests behind a 1,000-token shared system prompt gathered and attended
    the whole prompt by itself: 1,500 small attention calls and ~2 GB of copies per step."""
    if _FLASH is None or query.device.type != "cpu":
        return False
    hq, d = query.shape[1], query.shape[2]
    bs, hkv = key_cache.shape[1], key_cache.shape[2]
    g = hq // hkv
    idx = torch.tensor(prefill, device=block_tables.device)
    tables = block_tables.index_select(0, idx)
    # shared columns must lie wholly in every chunk's cached context, before its first new token
    cached = torch.tensor([lens[i] - q_lens[i] for i in prefill])
    shared = _num_shared_blocks(tables, cached, bs)
    if shared < 1:  # (never an empty key set: the fused kernel divides by the key length)
        return False
    lp = shared * bs
    own = sum(lens[i] for i in prefill) / len(prefill) - lp  # a chunk's own context, on average
    if len(prefill) < CASCADE_MIN_CHUNKS or lp < CASCADE_MIN_SHARED or lp < CASCADE_MIN_RATIO * own:
        return False  # each chunk still attends its own part: worth it only when the shared part dominates
    blocks = tables[0, :shared].long()
    kp = key_cache.index_select(0, blocks).view(-1, hkv, d).transpose(0, 1).unsqueeze(0).to(query.dtype)
    vp = value_cache.index_select(0, blocks).view(-1, hkv, d).transpose(0, 1).unsqueeze(0).to(query.dtype)
    rows = torch.cat([torch.arange(starts[i], starts[i] + q_lens[i]) for i in prefill]).to(query.device)
    n_all = rows.shape[0]
    qp = query.index_select(0, rows).view(n_all, hkv, g, d).permute(1, 0, 2, 3).reshape(1, hkv, n_all * g, d)
    try:
        o_shared, lse_shared = _FLASH(qp, kp, vp, 0.0, False, scale=scale)  # [1, Hkv, N*G, D], [1, Hkv, N*G]
    except RuntimeError:
        return False
    o_shared = o_shared[0].float().view(hkv, n_all, g, d).permute(1, 0, 2, 3).reshape(n_all, hq, d)
    lse_shared = lse_shared[0].float().view(hkv, n_all, g).permute(1, 0, 2).reshape(n_all, hq)
    try:
        o_own, lse_own = _own_parts(query, key_cache, value_cache, tables[:, shared:], prefill, starts, q_lens,
                                    [lens[i] - lp for i in prefill], scale)
    except RuntimeError:  # a dtype or shape the fused kernel refuses: ``out`` is untouched so far
        return False
    # one merge for every chunk's rows (element-wise ops per chunk would each wake the thread pool)
    m = torch.maximum(lse_shared, lse_own)
    w1, w2 = torch.exp(lse_shared - m).unsqueeze(-1), torch.exp(lse_own - m).unsqueeze(-1)
    out.index_copy_(0, rows, ((o_shared * w1 + o_own * w2) / (w1 + w2)).to(out.dtype))
    return True


def _own_parts(query, key_cache, value_cache, tables, prefill, starts, q_lens, lengths, scale):
    """Every prefill chunk's attention over its own context after the shared blocks (``lengths[k]``
    tokens through ``tables[k]``, the chunk's new tokens last), in one fused call padded to the
    longest: (outputs ``[N, Hq, D]``, log-sum-exp ``[N, Hq]``) in the chunks' row order, fp32. K/V
    heads are repeated for the query heads (these parts are short). A padded query row sees the
    first key only and is dropped; a padded key is hidden from every row."""
    p = len(prefill)
    _, hq, d = query.shape
    bs, hkv = key_cache.shape[1], key_cache.shape[2]
    dev = query.device
    n = torch.tensor([q_lens[i] for i in prefill], device=dev)
    length = torch.tensor(lengths, device=dev)
    n_max, l_blocks = int(n.max()), -(-max(lengths) // bs)
    k = _gather(key_cache, tables, l_blocks).to(query.dtype)  # [P, L, Hkv, D]
    v = _gather(value_cache, tables, l_blocks).to(query.dtype)
    if hq != hkv:
        k, v = k.repeat_interleave(hq // hkv, dim=2), v.repeat_interleave(hq // hkv, dim=2)
    j = torch.arange(n_max, device=dev)
    valid = j[None, :] < n[:, None]  # [P, n_max]: real query rows
    src = torch.tensor([starts[i] for i in prefill], device=dev)[:, None] + j[None, :]
    q = torch.zeros(p, n_max, hq, d, dtype=query.dtype, device=dev)
    q[valid] = query.index_select(0, src[valid])
    q_pos = (length - n)[:, None] + j[None, :]  # [P, n_max]: each row's position in its own part
    k_pos = torch.arange(l_blocks * bs, device=dev)
    hidden = (k_pos[None, None, :] > q_pos[:, :, None]) | (k_pos[None, None, :] >= length[:, None, None])
    hidden &= valid[:, :, None] | (k_pos > 0)[None, None, :]  # padded rows: key 0 visible, no NaN
    bias = torch.zeros(hidden.shape, dtype=query.dtype, device=dev).masked_fill_(hidden, float("-inf"))
    o, lse = _FLASH(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0.0, False,
                    attn_mask=bias.unsqueeze(1), scale=scale)  # [P, Hq, n_max, D], [P, Hq, n_max]
    return o.transpose(1, 2)[valid].float(), lse.transpose(1, 2)[valid].float()


def _prefill(query, key_cache, value_cache, block_table, seq_len, scale) -> torch.Tensor:
    n, hq, d = query.shape
    bs, hkv = key_cache.shape[1], key_cache.shape[2]
    nb = -(-seq_len // bs)
    blocks = block_table[:nb].long()
    k = key_cache.index_select(0, blocks).view(-1, hkv, d)[:seq_len].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
    v = value_cache.index_select(0, blocks).view(-1, hkv, d)[:seq_len].transpose(0, 1).unsqueeze(0)
    k, v = k.to(query.dtype), v.to(query.dtype)  # a bf16 cache under fp32 activations
    q = query.transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
    if seq_len == n:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=hq != hkv)
    else:
        q_pos = torch.arange(seq_len - n, seq_len, device=query.device)
        mask = torch.arange(seq_len, device=query.device)[None, :] <= q_pos[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=hq != hkv)
    return out[0].transpose(0, 1)
