"""The experts of a mixture-of-experts layer as two grouped GEMMs: the (token, k) pairs sorted by
expert into blocks of BLOCK_M rows of one expert each, then one launch for gate/up with SiLU-and-mul
fused and one for down with the routing weight; the sum over k is a reshape and a sum (no atomics:
the same inputs give the same bits). Everything stays on the device with fixed shapes, so a CUDA
graph captures it. The reference and CPU path is the "torch" entry of `MOE_BACKENDS`."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class MoeBlocks(NamedTuple):
    """Tile sizes and launch settings, the same for both GEMMs."""

    block_m: int  # sorted rows per program: every row of a block goes to one expert
    block_n: int  # output columns per program (gate/up: BLOCK_N of each, so 2 x BLOCK_N)
    block_k: int
    num_warps: int
    num_stages: int


# NOTE: chosen by the mean rows per expert, T * K / E, not by T: an expert's weights are read once
# per block of its rows, so what matters is how full a block gets. At decode (a few rows an
# expert) the GEMMs are bound by the weight reads: BLOCK_M = 16 (the smallest tensor-core tile)
# wastes the least padding and a long BLOCK_K streams each weight row in few iterations. At
# prefill (tens to thousands of rows an expert) they are bound by the math: larger M and N tiles
# reuse each loaded tile more. Untuned starting points (vLLM ships per-GPU tables); the gate/up
# kernel holds two BLOCK_M x BLOCK_N accumulators, which keeps BLOCK_N at 64 there.
DECODE = MoeBlocks(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3)
MIDDLE = MoeBlocks(block_m=32, block_n=64, block_k=64, num_warps=4, num_stages=3)
PREFILL = MoeBlocks(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=3)


def choose_blocks(pair_count: int, num_experts: int) -> MoeBlocks:
    rows_per_expert = pair_count / num_experts
    if rows_per_expert <= 16:
        return DECODE
    return MIDDLE if rows_per_expert <= 64 else PREFILL


def block_capacity(pair_count: int, num_experts: int, block_m: int) -> int:
    """Rows of the padded, sorted layout: an upper bound known without reading the routing."""
    # each expert that got any pair pads its last block by at most block_m - 1 rows
    bound = pair_count + min(num_experts, pair_count) * (block_m - 1)
    return triton.cdiv(bound, block_m) * block_m


def align_to_blocks(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort the pairs of `topk_ids` [tokens, top_k] by expert, each expert's run padded to a
    multiple of `block_m`. Returns `sorted_pairs` [capacity] int32 (the pair ``t * top_k + k`` on
    each row, ``tokens * top_k`` on padding) and `block_experts` [capacity // block_m] int32 (each
    block's expert, -1 past the last used block). Torch operations only, no host sync."""
    pair_count = topk_ids.numel()
    device = topk_ids.device
    experts = topk_ids.reshape(-1).long()
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, experts, torch.ones_like(experts))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    sorted_start = counts.cumsum(0) - counts
    by_expert, pairs = experts.sort(stable=True)
    rank = torch.arange(pair_count, device=device) - sorted_start[by_expert]
    capacity = block_capacity(pair_count, num_experts, block_m)
    sorted_pairs = torch.full((capacity,), pair_count, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, padded_start[by_expert] + rank, pairs.int())
    block_first = torch.arange(0, capacity, block_m, device=device)
    # the expert whose padded run holds each block's first row; num_experts past the last run
    block_experts = torch.searchsorted(padded_end, block_first, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1).int()
    return sorted_pairs, block_experts


@triton.jit
def moe_gate_up_silu(
    x,
    x_stride,
    w13,
    w13_expert_stride,
    w13_row_stride,
    sorted_pairs,
    block_experts,
    act,
    top_k,
    pair_count,
    hidden,
    inter,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """act[row, n] = silu(x[token] . w13[e, n]) * (x[token] . w13[e, inter + n]), per sorted row."""
    block = tl.program_id(0)
    expert = tl.load(block_experts + block).to(tl.int64)
    if expert < 0:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs + rows)
    real = pairs < pair_count
    tokens = (pairs // top_k).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < inter
    k = tl.arange(0, BLOCK_K)
    x_at = x + tokens[:, None] * x_stride + k[None, :]
    w13_expert = w13 + expert * w13_expert_stride
    gate_at = w13_expert + cols.to(tl.int64)[None, :] * w13_row_stride + k[:, None]
    up_at = gate_at + inter * w13_row_stride
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, hidden, BLOCK_K):
        k_in = k < hidden - start
        a = tl.load(x_at, mask=real[:, None] & k_in[None, :], other=0.0)
        w_in = k_in[:, None] & col_in[None, :]
        gate = tl.dot(a, tl.load(gate_at, mask=w_in, other=0.0), gate, input_precision=PRECISION)
        up = tl.dot(a, tl.load(up_at, mask=w_in, other=0.0), up, input_precision=PRECISION)
        x_at += BLOCK_K
        gate_at += BLOCK_K
        up_at += BLOCK_K
    # padding rows read zeros and store zeros, which the down kernel reads and never stores
    out = gate * tl.sigmoid(gate) * up
    act_at = act + rows.to(tl.int64)[:, None] * inter + cols[None, :]
    tl.store(act_at, out.to(act.dtype.element_ty), mask=col_in[None, :])


@triton.jit
def moe_down_weighted(
    act,
    w2,
    w2_expert_stride,
    w2_row_stride,
    sorted_pairs,
    block_experts,
    topk_weights,
    out,
    pair_count,
    hidden,
    inter,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """out[pair, h] = topk_weights[pair] * (act[row] . w2[e, h]), stored at the pair's row."""
    block = tl.program_id(0)
    expert = tl.load(block_experts + block).to(tl.int64)
    if expert < 0:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs + rows)
    real = pairs < pair_count
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < hidden
    k = tl.arange(0, BLOCK_K)
    act_at = act + rows.to(tl.int64)[:, None] * inter + k[None, :]
    w2_expert = w2 + expert * w2_expert_stride
    w_at = w2_expert + cols.to(tl.int64)[None, :] * w2_row_stride + k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, inter, BLOCK_K):
        k_in = k < inter - start
        a = tl.load(act_at, mask=k_in[None, :], other=0.0)
        w = tl.load(w_at, mask=k_in[:, None] & col_in[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        act_at += BLOCK_K
        w_at += BLOCK_K
    weight = tl.load(topk_weights + pairs, mask=real, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    out_at = out + pairs.to(tl.int64)[:, None] * hidden + cols[None, :]
    tl.store(out_at, acc.to(out.dtype.element_ty), mask=real[:, None] & col_in[None, :])


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    blocks: MoeBlocks | None = None,
    aligned: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """y [tokens, hidden] in x's dtype: ``sum_k topk_weights[t, k] * w2[e] @ (silu(w13[e, :I] @
    x[t]) * w13[e, I:] @ x[t])`` with ``e = topk_ids[t, k]``.
    x: [tokens, hidden] (bf16, fp16 or fp32); w13: [experts, 2 * I, hidden], gate rows then up;
    w2: [experts, hidden, I]; topk_weights: [tokens, top_k] in x's dtype; topk_ids: [tokens,
    top_k] int, each in [0, experts). `blocks`: the tiles, by default chosen from the shapes.
    `aligned`: the pairs already sorted into blocks of `blocks.block_m` (`sorted_pairs`,
    `block_experts`, as `align_to_blocks` gives them; `moe_route.route_and_align` does)."""
    tokens, hidden = x.shape
    num_experts, inter = w2.shape[0], w2.shape[2]
    top_k = topk_ids.shape[1]
    assert w13.shape == (num_experts, 2 * inter, hidden) and w2.shape[1] == hidden
    assert w13.dtype == x.dtype and w2.dtype == x.dtype
    if tokens == 0:  # a Triton grid of zero programs fails to launch
        return torch.empty_like(x)
    pair_count = tokens * top_k
    blocks = blocks or choose_blocks(pair_count, num_experts)
    x = x if x.stride(1) == 1 else x.contiguous()
    w13 = w13 if w13.stride(2) == 1 else w13.contiguous()
    w2 = w2 if w2.stride(2) == 1 else w2.contiguous()
    if aligned is None:
        aligned = align_to_blocks(topk_ids, num_experts, blocks.block_m)
    sorted_pairs, block_experts = aligned
    # NOTE: torch computes float32 matmuls in full precision by default; so do these (no TF32)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    act = torch.empty(len(sorted_pairs), inter, dtype=x.dtype, device=x.device)
    launch = {
        "BLOCK_M": blocks.block_m,
        "BLOCK_N": blocks.block_n,
        "BLOCK_K": blocks.block_k,
        "PRECISION": precision,
        "num_warps": blocks.num_warps,
        "num_stages": blocks.num_stages,
    }
    num_blocks = len(block_experts)
    moe_gate_up_silu[(num_blocks, triton.cdiv(inter, blocks.block_n))](
        x,
        x.stride(0),
        w13,
        w13.stride(0),
        w13.stride(1),
        sorted_pairs,
        block_experts,
        act,
        top_k,
        pair_count,
        hidden,
        inter,
        **launch,
    )
    per_pair = torch.empty(pair_count, hidden, dtype=x.dtype, device=x.device)
    moe_down_weighted[(num_blocks, triton.cdiv(hidden, blocks.block_n))](
        act,
        w2,
        w2.stride(0),
        w2.stride(1),
        sorted_pairs,
        block_experts,
        topk_weights.contiguous(),
        per_pair,
        pair_count,
        hidden,
        inter,
        **launch,
    )
    # NOTE: torch sums low-precision tensors in float32, rounding once at the end
    return per_pair.view(tokens, top_k, hidden).sum(1)
