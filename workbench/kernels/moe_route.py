"""A mixture-of-experts layer's routing in two launches at every batch size: each token's softmax
over the router's logits, its top-k experts (renormalised), the expert counts of the routing
record, and the pairs sorted into blocks of one expert each for `fused_moe`.

Why: the same work in torch is about 25 operations a layer (softmax, top-k, the division, a cast,
the count's index-add, and the sort into blocks: scatter-add, cumulative sums, a radix sort,
gathers, a search), each a kernel of its own; Qwen3-30B-A3B has 48 such layers a step. On an
H200 (2026-12-05, dummy Qwen3-30B-A3B, `bench --profile`) a decode step of 28 ms at batch 256
spent 5.5 ms in the families they fall in (`sampling`, `other`; 0.4 ms at batch 8), where the
experts' GEMMs took 15. An earlier form of this file did it all in one program, token after
token: 32 us a layer at batch 8, a quarter of the experts' time.

The tokens are cut into tiles of `TILE_TOKENS`, and the tiles shared among at most `MAX_PROGRAMS`
programs, each a contiguous run of tiles (so of pairs, in pair order):
1. `moe_route_topk`: each program routes its tokens (a tile at once: softmax in float32, top-k by
   repeated argmax, renormalised), counts its pairs per expert into its row of `program_counts`,
   adds its counted tokens' experts to the routing record, and marks its share of the sorted rows
   as padding.
2. `moe_route_align`: each program reads every program's counts, so knows where each expert's run
   starts (padded to whole blocks) and how many of its pairs earlier programs hold; it places its
   pairs, a tile at once (a pair's rank among its expert's pairs in the tile is a cumulative sum),
   and finds the expert of its share of the blocks.

Its results are the torch path's exactly: the top-k picks in decreasing weight (equal weights,
which bfloat16 logits often give, in expert order: `torch.topk` leaves theirs unspecified), the
pairs of one expert in pair order, each expert's run padded to a multiple of `block_m`, the same
`sorted_pairs` and `block_experts` as `fused_moe.align_to_blocks`; the counts are integers, so
the record's atomic adds give the same sums in any order."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fused_moe import block_capacity

TILE_TOKENS = 16  # tokens routed at once: a [16, experts] tile; 128 pairs at top-8
MAX_PROGRAMS = 64  # at most this many programs: the second launch reads all their counts at once
_BLOCK_CHUNK = 64  # blocks whose expert is found at once (a [chunk, experts] comparison)
_FILL_CHUNK = 1024  # sorted rows marked as padding at once


@triton.jit
def moe_route_topk(
    logits,
    logits_stride,
    topk_weights,
    topk_ids,
    program_counts,
    routing,
    counted,
    sorted_pairs,
    tokens,
    num_experts,
    tiles_per_program,
    capacity,
    fill_rows,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    COUNT: tl.constexpr,  # add each counted token's experts to `routing`
    WEIGHED: tl.constexpr,  # `counted` says which tokens count (else every token does)
    TILE: tl.constexpr,
    E_PAD: tl.constexpr,
    K_PAD: tl.constexpr,
    FILL_CHUNK: tl.constexpr,
):
    pid = tl.program_id(0)
    e = tl.arange(0, E_PAD)
    e_in = e < num_experts
    k = tl.arange(0, K_PAD)
    k_in = k < TOP_K
    counts = tl.zeros([E_PAD], dtype=tl.int32)  # this program's pairs per expert
    chosen = tl.zeros([E_PAD], dtype=tl.int32)  # its counted tokens per expert (the record)
    for tile in range(0, tiles_per_program):
        t = (pid * tiles_per_program + tile) * TILE + tl.arange(0, TILE)
        t_in = t < tokens
        at = logits + t.to(tl.int64)[:, None] * logits_stride + e[None, :]
        row = tl.load(at, mask=t_in[:, None] & e_in[None, :], other=-float("inf"))
        row = tl.where(t_in[:, None], row.to(tl.float32), 0.0)  # no NaN from a tile's tail
        p = tl.exp(row - tl.max(row, 1)[:, None])
        p = tl.where(e_in[None, :], p / tl.sum(p, 1)[:, None], -1.0)
        weights = tl.zeros([TILE, K_PAD], dtype=tl.float32)
        ids = tl.zeros([TILE, K_PAD], dtype=tl.int32)
        hits = tl.zeros([TILE, E_PAD], dtype=tl.int32)  # each token's picks
        for j in tl.static_range(TOP_K):
            best = tl.argmax(p, 1, tie_break_left=True).to(tl.int32)
            weights = tl.where(k[None, :] == j, tl.max(p, 1)[:, None], weights)
            ids = tl.where(k[None, :] == j, best[:, None], ids)
            hit = e[None, :] == best[:, None]
            hits += hit.to(tl.int32)
            p = tl.where(hit, -1.0, p)
        if RENORMALIZE:
            weights = weights / tl.sum(tl.where(k_in[None, :], weights, 0.0), 1)[:, None]
        out = t.to(tl.int64)[:, None] * TOP_K + k[None, :]
        mask = t_in[:, None] & k_in[None, :]
        tl.store(topk_weights + out, weights.to(topk_weights.dtype.element_ty), mask=mask)
        tl.store(topk_ids + out, ids.to(topk_ids.dtype.element_ty), mask=mask)
        counts += tl.sum(tl.where(t_in[:, None], hits, 0), 0)
        if COUNT:
            if WEIGHED:
                weight = tl.load(counted + t, mask=t_in, other=0).to(tl.int32)
            else:
                weight = t_in.to(tl.int32)
            chosen += tl.sum(hits * weight[:, None], 0)
    tl.store(program_counts + pid * E_PAD + e, counts)
    if COUNT:
        tl.atomic_add(routing + e, chosen.to(routing.dtype.element_ty), mask=e_in)
    mark = tl.zeros([FILL_CHUNK], tl.int32) + tokens * TOP_K  # a padding row's
    for first in range(pid * fill_rows, (pid + 1) * fill_rows, FILL_CHUNK):
        rows = first + tl.arange(0, FILL_CHUNK)
        tl.store(sorted_pairs + rows, mark, mask=(rows < capacity) & (rows < (pid + 1) * fill_rows))


@triton.jit
def moe_route_align(
    topk_ids,
    program_counts,
    sorted_pairs,
    block_experts,
    tokens,
    num_experts,
    tiles_per_program,
    num_programs,
    num_blocks,
    block_rows,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE: tl.constexpr,
    TILE_PAIRS: tl.constexpr,  # TILE x TOP_K, to a power of two
    E_PAD: tl.constexpr,
    P_PAD: tl.constexpr,
    BLOCK_CHUNK: tl.constexpr,
):
    pid = tl.program_id(0)
    e = tl.arange(0, E_PAD)
    e_in = e < num_experts
    c = tl.arange(0, P_PAD)
    table = tl.load(
        program_counts + c[:, None] * E_PAD + e[None, :], mask=(c < num_programs)[:, None], other=0
    )
    counts = tl.sum(table, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, 0)
    # each expert's next row for this program's pairs: its run's start, past earlier programs'
    start = padded_end - padded + tl.sum(tl.where((c < pid)[:, None], table, 0), 0)
    pair_count = tokens * TOP_K
    tile_pairs = TILE * TOP_K
    for tile in range(0, tiles_per_program):
        i = tl.arange(0, TILE_PAIRS)
        pair = (pid * tiles_per_program + tile) * tile_pairs + i
        real = (i < tile_pairs) & (pair < pair_count)
        ids = tl.load(topk_ids + pair, mask=real, other=-1).to(tl.int32)
        hit = (ids[:, None] == e[None, :]).to(tl.int32)  # [TILE_PAIRS, E_PAD]
        rank = tl.cumsum(hit, 0) - hit  # earlier pairs of the same expert in this tile
        rows = tl.sum((start[None, :] + rank) * hit, 1)
        tl.store(sorted_pairs + rows, pair, mask=real)
        start += tl.sum(hit, 0)
    # each block's expert: the run holding its first row (-1 past the last run)
    for first in range(pid * block_rows, (pid + 1) * block_rows, BLOCK_CHUNK):
        b = first + tl.arange(0, BLOCK_CHUNK)
        before = (padded_end[None, :] <= (b * BLOCK_M)[:, None]) & e_in[None, :]
        expert = tl.sum(before.to(tl.int32), 1)
        expert = tl.where(expert < num_experts, expert, -1)
        tl.store(block_experts + b, expert, mask=(b < num_blocks) & (b < (pid + 1) * block_rows))


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
    block_experts) of the router's `logits` [tokens, experts]; `routing` [experts], if given,
    gains each token's experts (those with `counted` 1 when `counted` is given)."""
    tokens, num_experts = logits.shape
    if tokens < 1 or not 1 <= top_k <= num_experts:
        raise ValueError(
            f"route_and_align takes at least 1 token and top_k in 1..{num_experts} (the experts), "
            f"got {tokens} tokens and top_k {top_k}"
        )
    device, pair_count = logits.device, tokens * top_k
    capacity = block_capacity(pair_count, num_experts, block_m)
    weights = torch.empty(tokens, top_k, dtype=dtype, device=device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=device)
    sorted_pairs = torch.empty(capacity, dtype=torch.int32, device=device)
    block_experts = torch.empty(capacity // block_m, dtype=torch.int32, device=device)
    tiles = triton.cdiv(tokens, TILE_TOKENS)
    programs = min(tiles, MAX_PROGRAMS)
    per_program = triton.cdiv(tiles, programs)
    programs = triton.cdiv(tiles, per_program)  # none left with no tile
    e_pad = triton.next_power_of_2(num_experts)
    program_counts = torch.empty(programs, e_pad, dtype=torch.int32, device=device)
    moe_route_topk[(programs,)](
        logits,
        logits.stride(0),
        weights,
        ids,
        program_counts,
        routing if routing is not None else program_counts,  # (not touched without COUNT)
        counted if counted is not None else program_counts,  # (not read without WEIGHED)
        sorted_pairs,
        tokens,
        num_experts,
        per_program,
        capacity,
        triton.cdiv(capacity, programs),
        TOP_K=top_k,
        RENORMALIZE=renormalize,
        COUNT=routing is not None,
        WEIGHED=counted is not None,
        TILE=TILE_TOKENS,
        E_PAD=e_pad,
        K_PAD=triton.next_power_of_2(top_k),
        FILL_CHUNK=_FILL_CHUNK,
        num_warps=4,
    )
    moe_route_align[(programs,)](
        ids,
        program_counts,
        sorted_pairs,
        block_experts,
        tokens,
        num_experts,
        per_program,
        programs,
        len(block_experts),
        triton.cdiv(len(block_experts), programs),
        TOP_K=top_k,
        BLOCK_M=block_m,
        TILE=TILE_TOKENS,
        TILE_PAIRS=triton.next_power_of_2(TILE_TOKENS * top_k),
        E_PAD=e_pad,
        P_PAD=triton.next_power_of_2(programs),
        BLOCK_CHUNK=_BLOCK_CHUNK,
        # NOTE: compiled for sm_90 by Triton 3.9 here: 155 registers, no spills at 4 warps; 8
        # warps took 228 and 64 KB of shared memory
        num_warps=4,
    )
    return weights, ids, sorted_pairs, block_experts
