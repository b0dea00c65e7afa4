"""Next-token sampling for a batch of sequences, vectorized over the batch.

Per row: repetition, presence and frequency penalties and ``min_tokens`` masking (only the rows
that need them, batched over those rows), then greedy argmax, or temperature -> top-k -> top-p
-> inverse-CDF draw with one uniform number from the sequence's own ``torch.Generator``. A row's
result therefore depends only on its logits and its generator, never on its batch mates.
"""

from __future__ import annotations

from itertools import chain

import torch

from engine.request import Sequence


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return g


class Sampler:
    def __init__(self, eos_token_ids: list[int] | None = None, seed: int = 0) -> None:
        self.eos_token_ids = list(eos_token_ids or [])
        self._seed_source = make_generator(seed)

    def generator_for(self, seq: Sequence) -> torch.Generator:
        """A sequence's generator: from ``params.seed`` (and its choice index) when given."""
        seed = seq.params.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
        return make_generator(seed * 1_000_003 + seq.index)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """One token per row of ``logits [len(seqs), vocab]``."""
        if not seqs:
            return []
        logits = self._apply_penalties(logits, seqs)
        greedy = [s.params.temperature == 0.0 for s in seqs]
        if all(greedy):
            return logits.argmax(dim=-1).tolist()
        out = logits.argmax(dim=-1).tolist()
        rows = [i for i, g in enumerate(greedy) if not g]
        sub = logits[rows] if len(rows) < len(seqs) else logits
        params = [seqs[i].params for i in rows]
        dev = sub.device
        temps = torch.tensor([p.temperature for p in params], dtype=sub.dtype, device=dev)
        sub = sub / temps.unsqueeze(1)
        top_k = [p.top_k for p in params]
        top_p = [p.top_p for p in params]
        vocab = sub.shape[-1]
        if any(0 < k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
            sub, order = sub.sort(dim=-1, descending=True)
            ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_k], device=dev)
            ranks = torch.arange(vocab, device=dev).unsqueeze(0)
            sub = sub.masked_fill(ranks >= ks.unsqueeze(1), float("-inf"))
            probs = sub.softmax(dim=-1)
            ps = torch.tensor(top_p, dtype=probs.dtype, device=dev).unsqueeze(1)
            # drop a token when the mass of the tokens before it already reaches top_p
            drop = (probs.cumsum(dim=-1) - probs) >= ps
            drop[:, 0] = False
            probs = probs.masked_fill(drop, 0.0)
        else:
            order = None
            probs = sub.softmax(dim=-1)
        cdf = probs.cumsum(dim=-1)
        # one uniform per row from the sequence's own (CPU) generator
        u = torch.stack([torch.rand((), generator=self._gen(seqs[i]), dtype=torch.float64) for i in rows])
        u = u.to(device=dev, dtype=cdf.dtype)
        idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1)).clamp_(max=vocab - 1)
        # never land on a zero-probability token (rounding at the very end of the CDF)
        chosen = probs.gather(1, idx) == 0
        if chosen.any():
            idx = torch.where(chosen, probs.argmax(dim=-1, keepdim=True), idx)
        tokens = (order.gather(1, idx) if order is not None else idx).squeeze(1).tolist()
        for r, tok in zip(rows, tokens, strict=True):
            out[r] = tok
        return out

    def _gen(self, seq: Sequence) -> torch.Generator:
        if seq.generator is None:
            seq.generator = self.generator_for(seq)
        return seq.generator

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Repetition penalty, then presence/frequency penalties, then ``min_tokens`` masking.

        Each applies only to the rows that ask for it, as one batched tensor operation over those
        rows. Returns ``logits`` itself when no row needs any (the common case: one cheap Python
        pass over the params, no tensor work), else a modified copy: the caller's tensor is never
        written.
        """
        rep: list[int] = []
        occ: list[int] = []
        block: list[int] = []
        for i, seq in enumerate(seqs):
            p = seq.params
            if p.repetition_penalty != 1.0:
                rep.append(i)
            if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
                occ.append(i)
            if seq.num_output_tokens < p.min_tokens:
                block.append(i)
        if not (rep or occ or block):
            return logits
        logits = logits.clone()
        vocab, dev = logits.shape[-1], logits.device
        if rep:  # HF/vLLM style, over every token seen so far (prompt and output)
            seen = _token_counts([seqs[i].token_ids for i in rep], vocab, dev) > 0
            r = _column([seqs[i].params.repetition_penalty for i in rep], dev)
            rows = torch.tensor(rep, device=dev)
            sub = logits[rows].float()
            sub = torch.where(seen, torch.where(sub > 0, sub / r, sub * r), sub)
            logits[rows] = sub.to(logits.dtype)
        if occ:  # OpenAI style, over this choice's generated output only
            counts = _token_counts([seqs[i].output_token_ids for i in occ], vocab, dev)
            fp = _column([seqs[i].params.frequency_penalty for i in occ], dev)
            pp = _column([seqs[i].params.presence_penalty for i in occ], dev)
            rows = torch.tensor(occ, device=dev)
            sub = logits[rows].float() - (fp * counts + pp * (counts > 0))
            logits[rows] = sub.to(logits.dtype)
        for i in block:
            p = seqs[i].params
            stop_ids = [*p.stop_token_ids, *([] if p.ignore_eos else self.eos_token_ids)]
            if stop_ids:
                logits[i, stop_ids] = float("-inf")
        return logits


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    """``values`` as a float32 ``[len(values), 1]`` tensor, to broadcast over the vocabulary."""
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)


def _token_counts(rows: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``counts[r, t]``: how often token ``t`` occurs in ``rows[r]`` (float32 ``[len(rows), vocab]``).

    One host-to-device copy of all the ids and one scatter-add, whatever the number of rows.
    """
    counts = torch.zeros(len(rows), vocab, dtype=torch.float32, device=device)
    lengths = [len(r) for r in rows]
    total = sum(lengths)
    if total:
        ids = torch.tensor(list(chain.from_iterable(rows)), dtype=torch.long, device=device)
        row_of = torch.repeat_interleave(torch.arange(len(rows), device=device),
                                         torch.tensor(lengths, device=device), output_size=total)
        counts.index_put_((row_of, ids), torch.ones(total, dtype=torch.float32, device=device), accumulate=True)
    return counts
