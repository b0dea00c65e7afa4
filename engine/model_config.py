"""The architecture of a Llama-family checkpoint, read from its Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(slots=True)
class ModelArch:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelArch:
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if not any(a in ("LlamaForCausalLM", "MistralForCausalLM") for a in archs):
            raise ValueError(f"unsupported architecture {archs}; expected a Llama-family model")
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or None
        theta = cfg.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
        if rope is not None and rope.get("rope_type", rope.get("type", "default")) == "default":
            rope = None
        eos = cfg.get("eos_token_id")
        eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            rope_scaling=rope,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelArch:
        model_dir = Path(model_dir)
        arch = cls.from_dict(json.loads((model_dir / "config.json").read_text()))
        gen = model_dir / "generation_config.json"
        if gen.exists():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            if eos is not None:
                extra = [eos] if isinstance(eos, int) else list(eos)
                arch.eos_token_ids = sorted(set(arch.eos_token_ids) | set(extra))
        return arch
