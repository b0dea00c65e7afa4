"""Turns a ``SchedulerOutput`` into one forward over a flat varlen batch and returns the logits
of the sequences that sample this step (those whose last scheduled token is their newest), and
the hidden states of the prompt positions whose logprobs are asked (``prompt_logprobs``).

Owns the KV pool: per layer one K and one V tensor ``[num_blocks, block_size, num_kv_heads,
head_dim]``, allocated once; ``num_blocks`` comes from ``kv_cache_memory_gb`` unless set.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.attention import AttentionMetadata
from engine.kv_cache_manager import KVCacheManager
from engine.model import LlamaModel
from engine.scheduler import SchedulerOutput


def kv_bytes_per_block(model: LlamaModel, block_size: int) -> int:
    a = model.arch
    elem = torch.empty((), dtype=model.dtype).element_size()
    return 2 * a.num_hidden_layers * block_size * a.num_key_value_heads * a.head_dim * elem


class ModelRunner:
    def __init__(self, model: LlamaModel, *, num_blocks: int, block_size: int, max_num_batched_tokens: int,
                 max_num_seqs: int, attention_backend: str) -> None:
        self.model = model
        self.block_size = block_size
        self.backend = attention_backend
        a, dev = model.arch, model.device
        shape = (num_blocks, block_size, a.num_key_value_heads, a.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=model.dtype, device=dev), torch.zeros(shape, dtype=model.dtype, device=dev))
            for _ in range(a.num_hidden_layers)
        ]
        # host staging buffers, reused every step
        n_tok = max_num_batched_tokens
        self._ids = np.zeros(n_tok, dtype=np.int64)
        self._pos = np.zeros(n_tok, dtype=np.int64)
        self._slots = np.zeros(n_tok, dtype=np.int64)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: duplicate whole blocks (src -> dst) in every layer."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.model.device)
        dst = torch.tensor([d for _, d in copies], device=self.model.device)
        for k, v in self.kv_caches:
            k[dst] = k[src]
            v[dst] = v[src]

    @torch.inference_mode()
    def run(self, sched: SchedulerOutput, kv: KVCacheManager
            ) -> tuple[torch.Tensor, list[int], list[tuple[int, int, torch.Tensor]]]:
        """One forward. Returns ``(logits [num_sampling, vocab] float32, indices into
        sched.seqs of the sampling sequences, prompt rows)``; the prompt rows, for each sequence
        scoring its prompt (``Request.scores_prompt``): ``(index into sched.seqs, first position,
        hidden states [m, hidden])`` of the positions this step computes that predict a prompt
        token (position ``p`` predicts token ``p + 1``)."""
        self.copy_blocks(sched.block_copies)
        bs = self.block_size
        num_seqs = len(sched.seqs)
        qsl = np.zeros(num_seqs + 1, dtype=np.int32)
        seq_lens = np.zeros(num_seqs, dtype=np.int32)
        tables = [kv.block_ids(seq) for seq in sched.seqs]
        max_blocks = max(len(t) for t in tables)
        bt = np.zeros((num_seqs, max_blocks), dtype=np.int32)
        sample_rows: list[int] = []
        sample_seqs: list[int] = []
        prompt_spans: list[tuple[int, int, int, int]] = []  # (seq index, first position, first row, rows)
        t = 0
        for i, (seq, n) in enumerate(zip(sched.seqs, sched.num_new_tokens, strict=True)):
            start = seq.num_computed_tokens
            end = start + n
            table = tables[i]
            bt[i, : len(table)] = table
            if n == 1:
                self._ids[t] = seq.token_ids[start]
                self._pos[t] = start
                self._slots[t] = table[start // bs] * bs + start % bs
            else:
                pos = np.arange(start, end)
                self._ids[t : t + n] = seq.token_ids[start:end]
                self._pos[t : t + n] = pos
                self._slots[t : t + n] = bt[i, pos // bs].astype(np.int64) * bs + pos % bs
            if seq.request.scores_prompt and seq.index == 0 and start < seq.num_prompt_tokens - 1:
                prompt_spans.append((i, start, t, min(end, seq.num_prompt_tokens - 1) - start))
            t += n
            qsl[i + 1] = t
            seq_lens[i] = end
            if end == seq.num_tokens:
                sample_rows.append(t - 1)
                sample_seqs.append(i)
        dev = self.model.device
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(self._slots[:t]).to(dev),
            query_start_loc=torch.from_numpy(qsl).to(dev),
            seq_lens=torch.from_numpy(seq_lens).to(dev),
            block_tables=torch.from_numpy(bt).to(dev),
            max_query_len=max(sched.num_new_tokens),
            max_seq_len=int(seq_lens.max()),
            backend=self.backend,
        )
        ids = torch.from_numpy(self._ids[:t]).to(dev)
        pos = torch.from_numpy(self._pos[:t]).to(dev)
        hidden = self.model.forward(ids, pos, self.kv_caches, meta)
        prompt_rows = [(i, first, hidden[row : row + m]) for i, first, row, m in prompt_spans]
        if not sample_rows:
            return hidden.new_empty((0, self.model.arch.vocab_size), dtype=torch.float32), [], prompt_rows
        rows = torch.tensor(sample_rows, device=dev)
        return self.model.compute_logits(hidden.index_select(0, rows)), sample_seqs, prompt_rows
