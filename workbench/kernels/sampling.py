"""Temperature sampling in one pass over the logits: the race ``argmax(logits / T - log E)`` with
Philox noise keyed by row key and column, so a seeded request gets the same tokens in any batch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# tuned with `python benchmarks/kernels.py`
BLOCK = 2048
SEGMENT = 8192  # columns per program
NUM_WARPS = 8


@triton.jit
def race_columns(logits_row, cols, u, inv_t, vocab, value, index):
    """Fold one block of columns (and their uniforms) into the running best per lane."""
    inside = cols < vocab
    x = tl.load(logits_row + cols, mask=inside, other=float("-inf")).to(tl.float32)
    raced = x * inv_t - tl.log(-tl.log(u))  # u == 0 gives -inf: never chosen
    v = tl.where(inside, raced, float("-inf"))
    # NOTE: each lane sees its columns in increasing order, and a tie keeps the earlier one
    better = v > value
    return tl.where(better, v, value), tl.where(better, cols, index)


@triton.jit
def race_segments(
    logits,
    row_stride,
    temperatures,
    keys,
    best_value,
    best_index,
    vocab,
    num_segments,
    SEGMENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    segment = tl.program_id(1)
    temperature = tl.load(temperatures + row)
    greedy = temperature == 0.0
    inv_t = 1.0 / tl.where(greedy, 1.0, temperature)
    key = tl.load(keys + row)
    logits_row = logits + row.to(tl.int64) * row_stride
    QUARTER: tl.constexpr = BLOCK // 4
    lane = tl.arange(0, QUARTER)
    value = tl.full([QUARTER], float("-inf"), tl.float32)
    index = tl.zeros([QUARTER], tl.int32)
    if greedy:  # the largest logit: no noise to draw (the row's program branches as one)
        for start in tl.static_range(0, SEGMENT, QUARTER):
            cols = segment * SEGMENT + start + lane
            x = tl.load(logits_row + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
            better = x > value  # (increasing columns in each lane: a tie keeps the earlier)
            value, index = tl.where(better, x, value), tl.where(better, cols, index)
    else:
        for start in tl.static_range(0, SEGMENT, BLOCK):
            first = segment * SEGMENT + start
            # one Philox call gives four uniforms: for columns first + lane + k * QUARTER
            u0, u1, u2, u3 = tl.rand4x(key, first // 4 + lane)
            cols = first + lane
            value, index = race_columns(logits_row, cols, u0, inv_t, vocab, value, index)
            cols += QUARTER
            value, index = race_columns(logits_row, cols, u1, inv_t, vocab, value, index)
            cols += QUARTER
            value, index = race_columns(logits_row, cols, u2, inv_t, vocab, value, index)
            cols += QUARTER
            value, index = race_columns(logits_row, cols, u3, inv_t, vocab, value, index)
    top = tl.max(value, 0)
    first_col = tl.min(tl.where(value == top, index, 2**31 - 1), 0)  # smallest column
    tl.store(best_value + row * num_segments + segment, top)
    tl.store(best_index + row * num_segments + segment, first_col)


def race_sample(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    keys: torch.Tensor,
    block: int = BLOCK,
    segment: int = SEGMENT,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """int64 token ids [batch], one per row of `logits` [batch, vocab] (any float dtype, CUDA).
    temperatures: [batch] float32, 0 for greedy rows; keys: [batch] int64 Philox keys (>= 0)."""
    batch, vocab = logits.shape
    if batch == 0:  # a Triton grid of zero programs fails to launch
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    segments = -(-vocab // segment)
    value = torch.empty(batch, segments, dtype=torch.float32, device=logits.device)
    index = torch.empty(batch, segments, dtype=torch.int32, device=logits.device)
    race_segments[(batch, segments)](
        logits,
        logits.stride(0),
        temperatures,
        keys,
        value,
        index,
        vocab,
        segments,
        SEGMENT=segment,
        BLOCK=block,
        num_warps=num_warps,
    )
    # NOTE: argmax returns the first maximal segment, so ties still go to the smallest column.
    return index.gather(1, value.argmax(1, keepdim=True)).squeeze(1).long()
