"""Next-token sampling for a batch of sequences, vectorized over the batch.

Per row: ``logit_bias``, repetition, presence and frequency penalties, ``min_tokens`` masking and
JSON mode's mask (only the rows that need them, batched over those rows), then greedy argmax, or temperature ->
top-k -> top-p -> inverse-CDF draw with one uniform number from the sequence's own ``torch.Generator``. A row's
result therefore depends only on its logits and its generator, never on its batch mates.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from itertools import chain

import torch

from engine.json_decoding import OPEN, JsonDecoding
from engine.request import Sequence
from engine.sampling_params import MIN_REPETITION_PENALTY

_MASK64 = 0xFFFF_FFFF_FFFF_FFFF
PROMPT_ROWS = 256  # prompt positions whose logits are made at once (256 x 49,152 x 4 bytes: 50 MB)


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed & _MASK64)
    return g


def choice_seed(seed: int, index: int) -> int:
    """A choice's generator seed from the request's 64-bit ``seed`` and the choice's index, mixed
    (SplitMix64's finaliser) so that every bit of both reaches the low 32 bits: the CPU generator
    (mt19937) keeps only those, so ``seed`` and ``seed + 2**32`` drew the same tokens, and one
    seed's choice 1 could be another's choice 0 (found by QA)."""
    z = ((seed & _MASK64) + (index + 1) * 0x9E37_79B9_7F4A_7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK64
    return z ^ (z >> 31)


class Sampler:
    def __init__(self, eos_token_ids: list[int] | None = None, seed: int | None = None, *,
                 json: JsonDecoding | None = None) -> None:
        self.eos_token_ids = list(eos_token_ids or [])
        self._seed_source = make_generator(int.from_bytes(os.urandom(8), "little") if seed is None else seed)
        self.json = json  # the engine's JSON mode: the masks of the rows that decode under a grammar

    def generator_for(self, seq: Sequence) -> torch.Generator:
        """A sequence's generator: from ``params.seed`` (and its choice index) when given."""
        seed = seq.params.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
        return make_generator(choice_seed(seed, seq.index))

    def sample(self, logits: torch.Tensor, seqs: list[Sequence], *, scratch: bool = False) -> list[int]:
        """One token per row of ``logits [len(seqs), vocab]``. ``scratch``: the caller has no further
        use for ``logits`` (no logprobs this step), so penalties and ``logit_bias`` write into it
        instead of a copy (a copy of [64, 49152] float32 logits is 12.6 MB a step)."""
        if not seqs:
            return []
        logits = self._apply_penalties(logits, seqs, scratch=scratch)
        greedy = [s.params.greedy for s in seqs]
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

    @staticmethod
    def logprobs(logits: torch.Tensor, seqs: list[Sequence], tokens: list[int]) -> list | None:
        """For the rows whose ``params.logprobs`` is set: (the chosen token's log probability,
        the ``logprobs`` most likely (token, logprob) pairs, most likely first), from the model's
        own distribution (``logits`` as the model gave them: no penalty, temperature, top-k or
        top-p); None for the other rows. None when no row asks. A greedy row's chosen token comes
        first among equally likely ones (``topk`` may order ties otherwise, e.g. on a GPU); with a
        penalty it may be another than the model's most likely, and is then listed where it ranks."""
        rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        if not rows:
            return None
        x = logits[rows].float()
        lse = x.logsumexp(dim=-1, keepdim=True)  # log-softmax = x - lse, without a [rows, vocab] copy
        index = torch.tensor([[tokens[i]] for i in rows], device=x.device)
        chosen = (x.gather(1, index) - lse).squeeze(1).tolist()
        k = max(seqs[i].params.logprobs for i in rows)
        if k:
            top_v, top_i = x.topk(k, dim=-1)
            top_v, top_i = (top_v - lse).tolist(), top_i.tolist()
        out: list = [None] * len(seqs)
        for j, i in enumerate(rows):
            n = seqs[i].params.logprobs
            if not n:
                out[i] = (chosen[j], ())
                continue
            top = tuple(zip(top_i[j][:n], top_v[j][:n], strict=True))
            tok = tokens[i]
            if seqs[i].params.greedy and top[0][0] != tok and chosen[j] >= top[0][1]:  # a tie: chosen first
                top = ((tok, chosen[j]), *(t for t in top if t[0] != tok))[:n]
            out[i] = (chosen[j], top)
        return out

    @staticmethod
    def prompt_logprobs(compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                        targets: list[int], k: int) -> list[tuple[float, tuple[tuple[int, float], ...], int]]:
        """Each prompt position's entry (``CompletionDelta.logprobs``' shape, and the token's rank):
        row ``j`` of ``hidden`` predicts ``targets[j]``; its log probability, the ``k`` most likely
        tokens, from the model's own distribution, and its rank there (1: the most likely; vLLM
        shows it). The logits are made ``PROMPT_ROWS`` rows at a time (a long prompt's whole
        ``[tokens, vocab]`` would be hundreds of megabytes)."""
        out: list[tuple[float, tuple[tuple[int, float], ...], int]] = []
        for lo in range(0, len(targets), PROMPT_ROWS):
            x = compute_logits(hidden[lo : lo + PROMPT_ROWS]).float()
            lse = x.logsumexp(dim=-1, keepdim=True)
            index = torch.tensor(targets[lo : lo + PROMPT_ROWS], device=x.device).unsqueeze(1)
            target = x.gather(1, index)
            chosen = (target - lse).squeeze(1).tolist()
            ranks = ((x > target).sum(dim=-1) + 1).tolist()
            if not k:
                out += [(c, (), r) for c, r in zip(chosen, ranks, strict=True)]
                continue
            top_v, top_i = x.topk(k, dim=-1)
            top_v, top_i = (top_v - lse).tolist(), top_i.tolist()
            out += [(c, tuple(zip(ti, tv, strict=True)), r)
                    for c, ti, tv, r in zip(chosen, top_i, top_v, ranks, strict=True)]
        return out

    @staticmethod
    def _bias(seq: Sequence, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's ``logit_bias`` as (token ids, float32 values) on ``device``, built once."""
        if seq.bias is None or seq.bias[0].device != device:
            bias = seq.params.logit_bias
            seq.bias = (torch.tensor(list(bias), dtype=torch.long, device=device),
                        torch.tensor(list(bias.values()), dtype=torch.float32, device=device))
        return seq.bias

    def _gen(self, seq: Sequence) -> torch.Generator:
        if seq.generator is None:
            seq.generator = self.generator_for(seq)
        return seq.generator

    def _apply_penalties(self, logits: torch.Tensor, seqs: list[Sequence], *, scratch: bool = False) -> torch.Tensor:
        """``logit_bias``, then the repetition penalty, then presence/frequency penalties, then
        ``min_tokens`` masking, then JSON mode's mask (the tokens that would break the object).

        Each applies only to the rows that ask for it, as one batched tensor operation over those
        rows. Returns ``logits`` itself when no row needs any (the common case: one cheap Python
        pass over the params, no tensor work), else a modified copy, or with ``scratch`` (and a
        contiguous tensor) ``logits`` modified in place.
        """
        bias: list[int] = []
        rep: list[int] = []
        occ: list[int] = []
        block: list[int] = []
        json_rows: list[int] = []
        for i, seq in enumerate(seqs):
            p = seq.params
            if p.logit_bias is not None:
                bias.append(i)
            if p.repetition_penalty != 1.0:
                rep.append(i)
            if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
                occ.append(i)
            if seq.json_state is not None:  # the grammar alone decides (EOS is banned until the object closes):
                json_rows.append(i)           # blocking stop tokens could leave it nothing (found by QA)
            if seq.num_output_tokens < p.min_tokens and (seq.json_state is None or seq.json_state is OPEN):
                block.append(i)  # (an optional grammar's open state: any text may still come, as in plain text)
        if not (bias or rep or occ or block or json_rows):
            return logits
        if not (scratch and logits.is_contiguous()):
            logits = logits.clone(memory_format=torch.contiguous_format)
        flat = logits.view(-1)  # (row, token) -> row * vocab + token
        vocab, dev = logits.shape[-1], logits.device
        if bias:  # OpenAI's logit_bias, added first (vLLM's order); each row's tokens are distinct keys
            pairs = [self._bias(seqs[i], dev) for i in bias]
            toks = torch.cat([t for t, _ in pairs])
            rows = torch.repeat_interleave(torch.tensor(bias, device=dev),
                                          torch.tensor([len(t) for t, _ in pairs], device=dev))
            # 2-D indexing: a token past the logits' width raises here rather than bias the next row
            logits[rows, toks] = (logits[rows, toks].float() + torch.cat([v for _, v in pairs])).to(logits.dtype)
        if rep:  # HF/vLLM style, over every token seen so far (prompt and output)
            at, row, _ = _occurrences(rep, [seqs[i].token_ids for i in rep], vocab, dev)
            r = _values([max(seqs[i].params.repetition_penalty, MIN_REPETITION_PENALTY) for i in rep], dev)[row]
            vals = flat[at].float()
            flat[at] = torch.where(vals > 0, vals / r, vals * r).to(flat.dtype)
        if occ:  # OpenAI style, over this choice's generated output only
            at, row, count = _occurrences(occ, [seqs[i].output_token_ids for i in occ], vocab, dev)
            fp = _values([seqs[i].params.frequency_penalty for i in occ], dev)[row]
            pp = _values([seqs[i].params.presence_penalty for i in occ], dev)[row]
            flat[at] = (flat[at].float() - (fp * count + pp)).to(flat.dtype)
        for i in block:
            p = seqs[i].params
            stop_ids = [*p.stop_token_ids, *([] if p.ignore_eos else self.eos_token_ids)]
            if stop_ids:
                logits[i, stop_ids] = float("-inf")
        for i in json_rows:  # (a mask as wide as the logits: JsonVocabulary.width is the model's vocabulary)
            entry = self.json.constraint(seqs[i])
            if entry.dtype == torch.bool:  # a dense state's banned tokens
                logits[i].masked_fill_(entry, float("-inf"))
            else:  # a sparse state's allowed ids
                keep = logits[i, entry]
                logits[i].fill_(float("-inf"))
                logits[i, entry] = keep
        return logits


def _values(values: list[float], device: torch.device) -> torch.Tensor:
    """One penalty per row, float32, to index with ``_occurrences``' ``k``."""
    return torch.tensor(values, dtype=torch.float32, device=device)


def _occurrences(rows: list[int], ids: list[list[int]], vocab: int, device: torch.device,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct ``(row, token)`` pairs of ``ids[k]`` (tokens of batch row ``rows[k]``).

    Returns ``at`` (flat index ``rows[k] * vocab + token`` into a contiguous ``[batch, vocab]``
    tensor, each pair once), ``k`` (which entry of ``rows`` it belongs to) and ``count`` (float32:
    how often the token occurs in ``ids[k]``). Sparse: the work grows with the number of tokens,
    not with ``batch * vocab``; one host-to-device copy and one ``unique`` whatever the rows.
    """
    lengths = torch.tensor([len(t) for t in ids], device=device)
    tokens = torch.tensor(list(chain.from_iterable(ids)), dtype=torch.long, device=device)
    k = torch.repeat_interleave(torch.arange(len(rows), device=device), lengths)
    key = k * vocab + tokens
    key, count = torch.unique(key, return_counts=True)
    k = key // vocab
    at = torch.tensor(rows, dtype=torch.long, device=device)[k] * vocab + key % vocab
    return at, k, count.to(torch.float32)
