"""From the QKV projection to attention's inputs in one launch (q/k norm, RoPE, KV store) instead
of seven eager kernels (FlashInfer's covers only (8, 1) and (64, 8) q/KV heads). Float32 until
the stores: the eager path rounds to bf16 between steps."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import check_pdl, launch_options, wait_for_previous


@triton.jit
def _rotate_heads(
    src,
    dst,
    heads,
    weight,
    cos,
    sin,
    eps,
    HEADS: tl.constexpr,
    HALF: tl.constexpr,
    NORM: tl.constexpr,
):
    """Norm (optional) and rotate `heads` heads of 2 * HALF values, from src to dst."""
    h = tl.arange(0, HEADS)[:, None]
    d = tl.arange(0, HALF)[None, :]
    inside = h < heads
    at = h * (2 * HALF) + d
    x1 = tl.load(src + at, mask=inside, other=0.0).to(tl.float32)
    x2 = tl.load(src + at + HALF, mask=inside, other=0.0).to(tl.float32)
    if NORM:
        mean_sq = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF)
        rstd = tl.rsqrt(mean_sq + eps)[:, None]
        x1 = x1 * rstd * tl.load(weight + d).to(tl.float32)
        x2 = x2 * rstd * tl.load(weight + HALF + d).to(tl.float32)
    tl.store(dst + at, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=inside)
    tl.store(dst + at + HALF, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=inside)


@triton.jit
def _qk_norm_rope_store(
    qkv,
    qkv_stride,
    positions,
    cos_table,
    sin_table,
    table_stride,
    q_weight,
    k_weight,
    eps,
    out_loc,
    k_cache,
    v_cache,
    q_out,
    num_heads,
    num_kv_heads,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous(PDL)  # (kernels/pdl.py: before anything another kernel writes)
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions + token)
    slot = tl.load(out_loc + token)
    d = tl.arange(0, HALF)[None, :]
    cos = tl.load(cos_table + pos * table_stride + d)
    sin = tl.load(sin_table + pos * table_stride + d)
    dim = 2 * HALF
    row = qkv + token * qkv_stride
    q_dst = q_out + token * num_heads * dim
    _rotate_heads(row, q_dst, num_heads, q_weight, cos, sin, eps, HEADS, HALF, NORM)
    k_src = row + num_heads * dim
    k_dst = k_cache + slot * num_kv_heads * dim
    _rotate_heads(k_src, k_dst, num_kv_heads, k_weight, cos, sin, eps, KV_HEADS, HALF, NORM)
    h = tl.arange(0, KV_HEADS)[:, None]
    e = tl.arange(0, 2 * HALF)[None, :]
    inside = h < num_kv_heads
    v = tl.load(k_src + num_kv_heads * dim + h * dim + e, mask=inside)
    tl.store(v_cache + slot * num_kv_heads * dim + h * dim + e, v, mask=inside)


def qk_norm_rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    out_loc: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    pdl: bool = False,
) -> torch.Tensor:
    """q [tokens, num_heads, head_dim], normalised and rotated; k and v written to the caches.
    qkv: [tokens, (num_heads + 2 * kv_heads) * head_dim]; cos, sin: float32 rotate-half tables;
    q_weight, k_weight: RMSNorm weights or None; out_loc: int64 slot per token; `pdl`:
    programmatic dependent launch (`kernels/pdl.py`)."""
    tokens = qkv.shape[0]
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    assert qkv.stride(1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q
    norm, pdl = q_weight is not None, check_pdl(qkv.device, pdl)
    _qk_norm_rope_store[(tokens,)](
        qkv,
        qkv.stride(0),
        positions,
        cos,
        sin,
        cos.stride(0),
        q_weight if norm else cos,  # unread without the norm
        k_weight if norm else cos,
        eps,
        out_loc,
        k_cache,
        v_cache,
        q,
        num_heads,
        num_kv_heads,
        HEADS=triton.next_power_of_2(num_heads),
        KV_HEADS=triton.next_power_of_2(num_kv_heads),
        HALF=head_dim // 2,
        NORM=norm,
        PDL=pdl,
        **launch_options(pdl),
    )
    return q
