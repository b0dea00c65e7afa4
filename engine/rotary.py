"""Rotary position embeddings (RoPE) as Llama uses them, with ``rope_theta`` and the
``linear`` and ``llama3`` frequency scalings. Half-split layout (``rotate_half``), as in the
Hugging Face checkpoints."""

from __future__ import annotations

import math

import torch


def inv_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` after the checkpoint's scaling, in float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: linear, llama3)")


class RotaryEmbedding:
    """Precomputed ``cos``/``sin`` tables ``[max_positions, head_dim]``; ``apply`` rotates q and k
    of a flat batch in place of their positions."""

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: dict | None,
        dtype: torch.dtype, device: torch.device,
    ) -> None:
        inv_freq = inv_frequencies(head_dim, theta, scaling)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(dtype=dtype, device=device)
        self.sin = emb.sin().to(dtype=dtype, device=device)
        self.half = head_dim // 2

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` rows ``[T, 1, D]`` of a batch's positions (looked up once per forward)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def apply(self, cos_sin: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor,
              k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``q [T, Hq, D]``, ``k [T, Hkv, D]`` rotated by ``tables(positions)``."""
        cos, sin = cos_sin
        return q * cos + _rotate_half(q, self.half) * sin, k * cos + _rotate_half(k, self.half) * sin


def _rotate_half(x: torch.Tensor, half: int) -> torch.Tensor:
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
