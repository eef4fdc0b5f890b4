"""Rotary position embedding with a cos/sin table indexed by absolute position."""

from __future__ import annotations

import math

import torch
from torch import nn


def inverse_frequencies(
    head_dim: int, theta: float, scaling: dict | None, device: str | None = None
) -> torch.Tensor:
    steps = torch.arange(0, head_dim, 2, dtype=torch.float, device=device)
    inv_freq = 1.0 / (theta ** (steps / head_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return inv_freq
    if kind == "llama3":  # Llama 3.1: stretch low frequencies, keep high ones, blend between
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_ctx = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        return torch.where(medium, blended, scaled)
    raise ValueError(f"unsupported rope_type {kind!r}")


class Rotary(nn.Module):
    """Applies RoPE (rotate-half convention) to q and k of shape [tokens, heads, head_dim]."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None):
        super().__init__()
        # NOTE: built for its shapes alone on the meta device (`decoder.full_shapes`), the table
        # is the CPU's: meta's first arange imports torch's decompositions and sympy (about 1 s
        # a process), and nothing reads a meta table
        device = "cpu" if torch.get_default_device().type == "meta" else None
        inv_freq = inverse_frequencies(head_dim, theta, scaling, device)
        # NOTE: position * inv_freq in float32, one product per entry, exactly as Hugging Face does.
        positions = torch.arange(max_positions, dtype=torch.float, device=device)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.fused = False  # set by Decoder.use_fused_kernels(): FlashInfer's in-place rope
        self.head_dim = head_dim

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused and q.numel() > 0:  # NOTE: FlashInfer's kernels fail on zero rows
            from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace

            if not hasattr(self, "cos_sin"):
                half = self.head_dim // 2
                self.cos_sin = torch.cat([self.cos[:, :half], self.sin[:, :half]], -1)
            n = q.shape[0]
            apply_rope_with_cos_sin_cache_inplace(
                positions, q.view(n, -1), k.view(n, -1), self.head_dim, self.cos_sin, is_neox=True
            )
            return q, k
        cos = self.cos[positions].to(q.dtype)[:, None, :]
        sin = self.sin[positions].to(q.dtype)[:, None, :]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)
