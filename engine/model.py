"""A Llama-family decoder (Llama, Mistral, SmolLM) whose attention reads and writes the paged
KV cache through ``kernels``. QKV and gate/up projections are fused into one matmul each.

    input_ids [T] -> embed -> N x (RMSNorm -> QKV -> RoPE -> write KV -> paged attention -> O
                                   + residual -> RMSNorm -> gate_up -> SiLU*up -> down + residual)
                  -> RMSNorm -> hidden [T, H];  compute_logits(hidden[rows]) -> [rows, vocab]

On the CPU in fp32 with the native attention backend, each layer runs the same math through
``kernels.native``'s fused kernels (residual add inside RMSNorm, RoPE writing K/V into the
cache, SiLU*up in one pass); elsewhere it is plain torch.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

import kernels
from engine.attention import AttentionMetadata
from engine.linear import Linear, resolve_linear_backend
from engine.model_config import ModelArch
from engine.rotary import RotaryEmbedding
from kernels import native


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class DecoderLayer:
    def __init__(self, arch: ModelArch, w: dict[str, torch.Tensor], linear_backend: str = "torch",
                 act_dtype: torch.dtype | None = None) -> None:
        self.eps = arch.rms_norm_eps
        self.num_heads, self.num_kv_heads, self.head_dim = (
            arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim,
        )
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.input_norm = w["input_layernorm.weight"].to(act_dtype or w["input_layernorm.weight"].dtype)
        self.post_norm = w["post_attention_layernorm.weight"].to(self.input_norm.dtype)
        lin = dict(backend=linear_backend, act_dtype=act_dtype)
        qkv_bias = (
            torch.cat([w["self_attn.q_proj.bias"], w["self_attn.k_proj.bias"], w["self_attn.v_proj.bias"]])
            if "self_attn.q_proj.bias" in w else None
        )
        self.qkv = Linear(torch.cat([w["self_attn.q_proj.weight"], w["self_attn.k_proj.weight"],
                                     w["self_attn.v_proj.weight"]]), qkv_bias, **lin)
        self.o = Linear(w["self_attn.o_proj.weight"], w.get("self_attn.o_proj.bias"), **lin)
        gate_up_bias = (
            torch.cat([w["mlp.gate_proj.bias"], w["mlp.up_proj.bias"]]) if "mlp.gate_proj.bias" in w else None
        )
        self.gate_up = Linear(torch.cat([w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"]]), gate_up_bias, **lin)
        self.down = Linear(w["mlp.down_proj.weight"], w.get("mlp.down_proj.bias"), **lin)

    def forward_fused(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, rope: RotaryEmbedding,
        kv: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The fp32 CPU path through the native kernels: the residual stream is carried beside
        ``x`` (the previous layer's MLP output) and added inside the next RMSNorm; RoPE writes
        K/V straight into the cache. Returns ``(mlp output, residual)``."""
        t = x.shape[0]
        if residual is None:
            residual, h = x, native.rms_norm(x, self.input_norm, self.eps)
        else:
            h = native.add_rms_norm(x, residual, self.input_norm, self.eps)
        key_cache, value_cache = kv
        q = native.rope_and_write_kv(self.qkv(h), positions, rope.cos, rope.sin, key_cache, value_cache,
                                     meta.slot_mapping, self.num_heads, self.num_kv_heads, self.head_dim)
        attn = kernels.paged_attention(
            q, key_cache, value_cache,
            query_start_loc=meta.query_start_loc, seq_lens=meta.seq_lens, block_tables=meta.block_tables,
            scale=self.scale, max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len,
            backend=meta.backend,
        )
        h = native.add_rms_norm(self.o(attn.reshape(t, self.q_size)), residual, self.post_norm, self.eps)
        return self.down(native.silu_mul(self.gate_up(h))), residual

    def forward(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], rope: RotaryEmbedding,
        kv: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        h = rms_norm(x, self.input_norm, self.eps)
        qkv = self.qkv(h)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        q, k = rope.apply(cos_sin, q, k)
        key_cache, value_cache = kv
        kernels.write_kv_cache(k, v, key_cache, value_cache, meta.slot_mapping, backend=meta.backend)
        attn = kernels.paged_attention(
            q, key_cache, value_cache,
            query_start_loc=meta.query_start_loc, seq_lens=meta.seq_lens, block_tables=meta.block_tables,
            scale=self.scale, max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len,
            backend=meta.backend,
        )
        x = x + self.o(attn.reshape(t, self.q_size))
        h = rms_norm(x, self.post_norm, self.eps)
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def check_weights(arch: ModelArch, shapes: dict[str, tuple[int, ...]], where: object) -> None:
    """The weights are the model ``config.json`` describes: every tensor a layer reads, of its
    shape, and as many layers (found by QA: a config with 20 layers against 30 in the weights, or 9
    KV heads against 3, loaded and answered nonsense or nothing, exit 0)."""
    h, d = arch.hidden_size, arch.head_dim
    want = {"model.embed_tokens.weight": (arch.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}."
        want |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                 p + "self_attn.q_proj.weight": (arch.num_attention_heads * d, h),
                 p + "self_attn.k_proj.weight": (arch.num_key_value_heads * d, h),
                 p + "self_attn.v_proj.weight": (arch.num_key_value_heads * d, h),
                 p + "self_attn.o_proj.weight": (h, arch.num_attention_heads * d),
                 p + "mlp.gate_proj.weight": (arch.intermediate_size, h),
                 p + "mlp.up_proj.weight": (arch.intermediate_size, h),
                 p + "mlp.down_proj.weight": (h, arch.intermediate_size)}
    for name, shape in want.items():
        if name not in shapes:
            raise ValueError(f"the weights in {where} have no {name}, which its config.json needs")
        if shapes[name] != shape:
            raise ValueError(f"the weights in {where} do not fit its config.json: {name} is {list(shapes[name])}, "
                             f"the config makes it {list(shape)}")
    layers = {int(n.split(".")[2]) for n in shapes if n.startswith("model.layers.") and n.split(".")[2].isdigit()}
    if layers and max(layers) + 1 != arch.num_hidden_layers:
        raise ValueError(f"the weights in {where} have {max(layers) + 1} layers, its config.json "
                         f"{arch.num_hidden_layers}")


class LlamaModel:
    def __init__(self, arch: ModelArch, weights: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, linear_backend: str = "auto") -> None:
        self.arch = arch
        self.dtype, self.device = dtype, device
        self.linear_backend = resolve_linear_backend(linear_backend, device, dtype)
        # The native fused layers (CPU, used with the "native" attention backend) keep activations
        # in fp32; with bf16 weights only the linears and the KV cache are bf16 ("mixed" bf16).
        self.fused_layers = native.layers_supported(dtype, device) and (
            dtype == torch.float32 or self.linear_backend == "onednn")
        self.act_dtype = torch.float32 if self.fused_layers else dtype
        act = self.act_dtype if self.act_dtype != dtype else None
        self.embed = weights["model.embed_tokens.weight"]
        self.norm = weights["model.norm.weight"].to(self.act_dtype)
        lm_head = self.embed if arch.tie_word_embeddings or "lm_head.weight" not in weights \
            else weights["lm_head.weight"]
        self.lm_head = Linear(lm_head, backend=self.linear_backend, act_dtype=act)
        self.layers = []
        for i in range(arch.num_hidden_layers):
            prefix = f"model.layers.{i}."
            layer_w = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
            self.layers.append(DecoderLayer(arch, layer_w, self.linear_backend, act))
        self.rope = RotaryEmbedding(arch.head_dim, arch.max_position_embeddings, arch.rope_theta,
                                    arch.rope_scaling, self.act_dtype, device)

    @classmethod
    def from_dir(cls, model_dir: str | Path, device: torch.device, dtype: torch.dtype,
                 linear_backend: str = "auto") -> LlamaModel:
        """Load ``config.json`` and every ``*.safetensors`` of a Hugging Face directory."""
        from safetensors import safe_open

        model_dir = Path(model_dir)
        arch = ModelArch.from_dir(model_dir)
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {model_dir}")
        weights: dict[str, torch.Tensor] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    if "rotary_emb" in name:
                        continue
                    weights[name] = sf.get_tensor(name).to(device=device, dtype=dtype)
        check_weights(arch, {name: tuple(t.shape) for name, t in weights.items()}, model_dir)
        return cls(arch, weights, device, dtype, linear_backend)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` of a flat batch (after the final norm)."""
        x = F.embedding(input_ids, self.embed).to(self.act_dtype)
        if meta.backend == "native" and self.fused_layers:
            residual = None
            for layer, kv in zip(self.layers, kv_caches, strict=True):
                x, residual = layer.forward_fused(x, residual, positions, self.rope, kv, meta)
            return native.add_rms_norm(x, residual, self.norm, self.arch.rms_norm_eps)
        cos_sin = self.rope.tables(positions)
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x = layer.forward(x, cos_sin, self.rope, kv, meta)
        return rms_norm(x, self.norm, self.arch.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
