"""The attention layer: merged QKV projection, optional q/k norm, RoPE, backend, output proj.

Tensor-parallel: each rank holds 1/size of the heads; after qkv_proj all sizes are local."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..distributed import SINGLE, TPGroup
from .norm import RMSNorm
from .parallel import ColumnParallelLinear, RowParallelLinear, split
from .rotary import Rotary

if TYPE_CHECKING:
    from ..attention.context import ForwardContext


class AttentionLayer(nn.Module):
    def __init__(
        self,
        layer_id: int,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: Rotary,
        qkv_bias: bool,
        qk_norm_eps: float | None,  # Qwen3 normalises each head of q and k before RoPE
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = split(num_heads, tp, "num_heads")
        self.num_kv_heads = split(num_kv_heads, tp, "num_kv_heads")
        self.head_dim = head_dim
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        q_full, kv_full = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = ColumnParallelLinear(
            hidden_size, (q_full, kv_full, kv_full), bias=qkv_bias, tp=tp
        )
        self.o_proj = RowParallelLinear(q_full, hidden_size, bias=False, tp=tp)
        self.rotary = rotary
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        # set by Decoder.use_fused_kernels(): q/k norm, RoPE and the KV store in one Triton kernel
        self.fused_rope = False
        self.pdl = False  # the fused kernel launches with PDL (`Decoder.use_pdl`)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        if self.fused_rope:
            return self.o_proj(self._fused_inputs(qkv, positions, ctx).view(-1, self.q_size))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        out = ctx.attend(self.layer_id, q, k, v)
        return self.o_proj(out.reshape(-1, self.q_size))

    def _fused_inputs(
        self, qkv: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        from ..kernels.qk_norm_rope import qk_norm_rope_store

        k_cache, v_cache, out_loc = ctx.kv_target(self.layer_id)
        norm = self.q_norm is not None
        q = qk_norm_rope_store(
            qkv,
            positions,
            self.rotary.cos,
            self.rotary.sin,
            self.q_norm.weight if norm else None,
            self.k_norm.weight if norm else None,
            self.q_norm.eps if norm else 0.0,
            out_loc,
            k_cache,
            v_cache,
            self.num_heads,
            pdl=self.pdl,
        )
        return ctx.attend(self.layer_id, q, None, None)
