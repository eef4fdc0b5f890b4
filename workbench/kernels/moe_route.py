"""A mixture-of-experts layer's routing at decode batch sizes in one launch: each token's softmax
over the router's logits, its top-k experts (renormalised), the expert counts of the routing
record, and the pairs sorted into blocks of one expert each for `fused_moe`.

Why: the same work in torch is about 25 small operations a layer, by count of the code (softmax,
top-k, the division, a cast, the count's index-add, and the sort into blocks: scatter-add,
cumulative sums, a radix sort, gathers, a search; not yet profiled on a GPU), each a kernel of a
few microseconds even inside a CUDA graph, for a handful of tokens; Qwen3-30B-A3B has 48 such
layers a step. One program does it all here, token after token, so it is for small batches (at
most `MAX_PAIRS` token-expert pairs); larger ones keep the torch path, whose kernels are wide
enough to fill the GPU.

Its results are the torch path's: the top-k picks in decreasing weight (equal weights, which
bfloat16 logits often give, in expert order: `torch.topk` leaves theirs unspecified), the pairs
of one expert in their order, each expert's run padded to a multiple of `block_m`, the same
`sorted_pairs` and `block_experts` as `fused_moe.align_to_blocks`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fused_moe import block_capacity

MAX_PAIRS = 256  # tokens x top_k: 32 decoding tokens at top-8 (Qwen3-MoE), 128 at top-2
_BLOCK_CHUNK = 64  # blocks whose expert is found at once (a [chunk, experts] comparison)
_FILL_CHUNK = 1024  # sorted rows filled with the padding mark at once


@triton.jit
def moe_route_align(
    logits,
    logits_stride,
    topk_weights,
    topk_ids,
    sorted_pairs,
    block_experts,
    routing,
    counted,
    tokens,
    num_experts,
    capacity,
    num_blocks,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    COUNT: tl.constexpr,  # add each counted token's experts to `routing`
    WEIGHED: tl.constexpr,  # `counted` says which tokens count (else every token does)
    BLOCK_M: tl.constexpr,
    E_PAD: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_CHUNK: tl.constexpr,
    FILL_CHUNK: tl.constexpr,
):
    e = tl.arange(0, E_PAD)
    e_in = e < num_experts
    k = tl.arange(0, K_PAD)
    k_in = k < TOP_K
    pair_count = tokens * TOP_K
    counts = tl.zeros([E_PAD], dtype=tl.int32)  # pairs per expert
    chosen = tl.zeros([E_PAD], dtype=tl.int32)  # counted tokens per expert (the record)
    # 1. each token: softmax in float32, top-k by repeated argmax, renormalised
    for t in range(0, tokens):
        row = tl.load(logits + t * logits_stride + e, mask=e_in, other=-float("inf"))
        row = row.to(tl.float32)
        p = tl.exp(row - tl.max(row, 0))
        p = tl.where(e_in, p / tl.sum(p, 0), -1.0)
        weights = tl.zeros([K_PAD], dtype=tl.float32)
        ids = tl.zeros([K_PAD], dtype=tl.int32)
        picked = tl.zeros([E_PAD], dtype=tl.int32)
        for j in tl.static_range(TOP_K):
            best = tl.argmax(p, 0, tie_break_left=True).to(tl.int32)
            weights = tl.where(k == j, tl.max(p, 0), weights)
            ids = tl.where(k == j, best, ids)
            picked += (e == best).to(tl.int32)
            p = tl.where(e == best, -1.0, p)
        if RENORMALIZE:
            weights = weights / tl.sum(tl.where(k_in, weights, 0.0), 0)
        tl.store(topk_weights + t * TOP_K + k, weights.to(topk_weights.dtype.element_ty), k_in)
        tl.store(topk_ids + t * TOP_K + k, ids.to(topk_ids.dtype.element_ty), mask=k_in)
        counts += picked
        if COUNT:
            if WEIGHED:
                chosen += picked * tl.load(counted + t).to(tl.int32)
            else:
                chosen += picked
    if COUNT:
        record = tl.load(routing + e, mask=e_in, other=0)
        tl.store(routing + e, record + chosen.to(record.dtype), mask=e_in)
    # 2. each expert's run of rows, padded to whole blocks
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    start = padded_end - padded
    mark = tl.zeros([FILL_CHUNK], tl.int32) + pair_count  # a padding row's
    for first in range(0, capacity, FILL_CHUNK):
        rows = first + tl.arange(0, FILL_CHUNK)
        tl.store(sorted_pairs + rows, mark, mask=rows < capacity)
    tl.debug_barrier()  # the marks above, and the ids of step 1, before they are read or covered
    # 3. each pair at its expert's next row, in pair order (a token's experts differ)
    for t in range(0, tokens):
        ids = tl.load(topk_ids + t * TOP_K + k, mask=k_in, other=-1).to(tl.int32)
        hit = ids[:, None] == e[None, :]  # [K_PAD, E_PAD]
        rows = tl.sum(tl.where(hit, start[None, :], 0), 1)
        tl.store(sorted_pairs + rows, t * TOP_K + k, mask=k_in)
        start += tl.sum(hit.to(tl.int32), 0)
    # 4. each block's expert: the run holding its first row (-1 past the last run)
    for first in range(0, num_blocks, BLOCK_CHUNK):
        b = first + tl.arange(0, BLOCK_CHUNK)
        before = (padded_end[None, :] <= (b * BLOCK_M)[:, None]) & e_in[None, :]
        expert = tl.sum(before.to(tl.int32), 1)
        expert = tl.where(expert < num_experts, expert, -1)
        tl.store(block_experts + b, expert, mask=b < num_blocks)


def route_and_align(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    dtype: torch.dtype,
    block_m: int,
    routing: torch.Tensor | None = None,
    counted: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(topk_weights [tokens, top_k] in `dtype`, topk_ids [tokens, top_k] int64, sorted_pairs,
    block_experts) of the router's `logits` [tokens, experts]; `routing` [experts] int32, if
    given, gains each token's experts (those with `counted` 1 when `counted` is given)."""
    tokens, num_experts = logits.shape
    pair_count = tokens * top_k
    if not 0 < pair_count <= MAX_PAIRS:
        raise ValueError(f"route_and_align takes 1 to {MAX_PAIRS} pairs, got {pair_count}")
    device = logits.device
    capacity = block_capacity(pair_count, num_experts, block_m)
    weights = torch.empty(tokens, top_k, dtype=dtype, device=device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=device)
    sorted_pairs = torch.empty(capacity, dtype=torch.int32, device=device)
    block_experts = torch.empty(capacity // block_m, dtype=torch.int32, device=device)
    moe_route_align[(1,)](
        logits,
        logits.stride(0),
        weights,
        ids,
        sorted_pairs,
        block_experts,
        routing if routing is not None else ids,  # (not touched without COUNT)
        counted if counted is not None else ids,  # (not read without WEIGHED)
        tokens,
        num_experts,
        capacity,
        len(block_experts),
        TOP_K=top_k,
        RENORMALIZE=renormalize,
        COUNT=routing is not None,
        WEIGHED=counted is not None,
        BLOCK_M=block_m,
        E_PAD=triton.next_power_of_2(num_experts),
        K_PAD=triton.next_power_of_2(top_k),
        BLOCK_CHUNK=_BLOCK_CHUNK,
        FILL_CHUNK=_FILL_CHUNK,
        num_warps=4,
    )
    return weights, ids, sorted_pairs, block_experts
