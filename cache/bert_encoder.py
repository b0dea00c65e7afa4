"""A lean BERT encoder for the cache's query embedding (MiniLM: 6 layers, hidden 384).

torch's CPU build sends ``F.linear`` to MKL, which on the dev machine's AMD CPU is 2-3x slower
than oneDNN for these small matrices, and HF's ``BertModel`` forward adds about 1 ms of module,
mask and dispatch work to a short query. This module runs the same computation as plain tensor
ops over the model's own weights:

    ids ─► word + position + type(0) embeddings ─► LayerNorm
        ─► 6 × [ fused QKV linear ─► SDPA (key-padding mask) ─► out linear ─► +res, LayerNorm
                 ─► up linear + GELU(erf) ─► down linear ─► +res, LayerNorm ]
        ─► mean over real tokens ─► L2 normalise

Linears use oneDNN with weights reordered once into its blocked layout
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, GELU fused); where that op
is missing or fails its self-check the encoder uses ``F.linear``. Vectors equal the
sentence-transformers ones to ~1e-6 (checked in ``tests/cache/test_cache_embedder_index.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


class Linear:
    """y = x W^T + b (optionally GELU), on oneDNN's prepacked weights when available."""

    __slots__ = ("weight", "bias", "packed", "gelu")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, *, gelu: bool = False,
                 packed: torch.Tensor | None = None) -> None:
        self.weight = weight.detach().float().contiguous()
        self.bias = bias.detach().float().contiguous()
        self.packed = packed
        self.gelu = gelu

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            if self.gelu:
                return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "gelu", [], "none")
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        y = F.linear(x, self.weight, self.bias)
        return F.gelu(y) if self.gelu else y

    def pack(self) -> bool:
        """Switch to oneDNN if it gives the same result as ``F.linear``; False if not."""
        if not torch.backends.mkldnn.is_available():
            return False
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 64)
            probe = torch.randn(5, self.weight.shape[1], generator=torch.Generator().manual_seed(0))
            want = F.linear(probe, self.weight, self.bias)
            want = F.gelu(want) if self.gelu else want
            self.packed = packed
            got = self(probe)
        except Exception as e:  # noqa: BLE001 - any failure: stay on F.linear
            self.packed = None
            log.info("oneDNN linear unavailable (%s); using F.linear", e)
            return False
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
            self.packed = None
            return False
        return True


@dataclass(slots=True)
class Layer:
    qkv: Linear
    out: Linear
    ln1: tuple[torch.Tensor, torch.Tensor]
    up: Linear
    down: Linear
    ln2: tuple[torch.Tensor, torch.Tensor]


class BertEncoder:
    """Mean-pooled, L2-normalised sentence vectors from a BERT checkpoint's weights.

    Build with ``BertEncoder.from_hf(bert_model)``; call ``encode(input_ids, attention_mask)``
    (int64 ``[B, T]``, right padded) under any grad mode; returns float32 ``[B, hidden]``.
    """

    def __init__(self, *, word: torch.Tensor, position: torch.Tensor, token_type: torch.Tensor,
                 ln: tuple[torch.Tensor, torch.Tensor], layers: list[Layer], heads: int, eps: float) -> None:
        self.word, self.position, self.token_type0 = word, position, token_type[0]
        self.ln = ln
        self.layers = layers
        self.heads = heads
        self.hidden = word.shape[1]
        self.eps = eps
        self.onednn = False

    @classmethod
    def from_hf(cls, model: torch.nn.Module, *, use_onednn: bool = True) -> BertEncoder:
        cfg = model.config
        if getattr(cfg, "position_embedding_type", "absolute") != "absolute" or cfg.hidden_act != "gelu":
            raise ValueError("only absolute positions and erf GELU are supported")
        sd = {k: v.detach().float() for k, v in model.state_dict().items()}

        def ln(p: str) -> tuple[torch.Tensor, torch.Tensor]:
            return sd[p + ".weight"].contiguous(), sd[p + ".bias"].contiguous()

        layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"encoder.layer.{i}."
            a = p + "attention.self."
            qkv_w = torch.cat([sd[a + n + ".weight"] for n in ("query", "key", "value")])
            qkv_b = torch.cat([sd[a + n + ".bias"] for n in ("query", "key", "value")])
            layers.append(Layer(
                qkv=Linear(qkv_w, qkv_b),
                out=Linear(sd[p + "attention.output.dense.weight"], sd[p + "attention.output.dense.bias"]),
                ln1=ln(p + "attention.output.LayerNorm"),
                up=Linear(sd[p + "intermediate.dense.weight"], sd[p + "intermediate.dense.bias"], gelu=True),
                down=Linear(sd[p + "output.dense.weight"], sd[p + "output.dense.bias"]),
                ln2=ln(p + "output.LayerNorm"),
            ))
        enc = cls(word=sd["embeddings.word_embeddings.weight"].contiguous(),
                  position=sd["embeddings.position_embeddings.weight"].contiguous(),
                  token_type=sd["embeddings.token_type_embeddings.weight"].contiguous(),
                  ln=ln("embeddings.LayerNorm"), layers=layers, heads=cfg.num_attention_heads,
                  eps=float(cfg.layer_norm_eps))
        if use_onednn:
            linears = [lin for L in layers for lin in (L.qkv, L.out, L.up, L.down)]
            enc.onednn = all([lin.pack() for lin in linears])
            if not enc.onednn:  # all or nothing: one numeric path per model
                for lin in linears:
                    lin.packed = None
        return enc

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self._encode(input_ids, attention_mask)

    def _encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, t = input_ids.shape
        h, heads, eps = self.hidden, self.heads, self.eps
        x = self.word[input_ids] + self.position[:t] + self.token_type0
        x = F.layer_norm(x, (h,), *self.ln, eps).reshape(b * t, h)
        padded = bool((attention_mask == 0).any())
        # key-padding mask, broadcast over heads and query positions; None when no padding
        mask = attention_mask.bool()[:, None, None, :] if padded else None
        for L in self.layers:
            q, k, v = L.qkv(x).view(b, t, 3, heads, h // heads).permute(2, 0, 3, 1, 4).unbind(0)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            ctx = ctx.transpose(1, 2).reshape(b * t, h)
            x = F.layer_norm(L.out(ctx) + x, (h,), *L.ln1, eps)
            x = F.layer_norm(L.down(L.up(x)) + x, (h,), *L.ln2, eps)
        x = x.view(b, t, h)
        m = attention_mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1)
