"""Tensor parallelism, one timeline for all ranks: every rank's profiler events on rank 0's clock,
and how late each rank came to each step's all-reduces.

Clocks. Each rank records its events on its own clock, and each step's events of a rank above
0 move onto rank 0's clock by one offset, found at the step's all-reduces. An all-reduce is a
barrier: no rank ends it before every rank has begun it. So the k-th all-reduce of a step
bounds the offset (rank r's clock + offset = rank 0's) from both sides:
rank 0's start - rank r's end <= offset <= rank 0's end - rank r's start. The offset is the
middle of the tightest bounds of the step's all-reduces: the all-reduces' ends then agree as
closely as the ranks' own records allow, and it is off the true offset by at most half the
bounds' width (a few hundred microseconds with gloo on a busy CPU, where the ends themselves
scatter by milliseconds: a thread woken late records a late end, which is why the ends'
differences alone, even their median, do worse). Bounds that contradict each other (records
that do not pair up) fall back to the median, over the all-reduces, of rank 0's end minus rank
r's. A step without all-reduces keeps the rank's last offset.

Skew. Once aligned, the start of a rank's k-th all-reduce is when that rank got there. At each
all-reduce the latest rank is late by the latest arrival minus the earliest. Per step:
`rank_skew_ms` sums that over the step's all-reduces (the earliest ranks' wait for the latest),
`late_ms_rank<r>` is what rank r alone was late by, summed, and `latest_rank` the rank that came
last to most of them (the later one in all on a tie).

The all-reduces are NCCL's kernels on a GPU (a name with "AllReduce"), else their host work
(`profiling.ALL_REDUCES`: gloo's runs on a thread of its own from when the rank hands it over).
All-gathers are left out: the ranks' control messages use gloo's all-gather too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from ..profiling import ALL_REDUCES

if TYPE_CHECKING:
    import pandas as pd

CLOCK_ALIGNMENT = (
    "each rank's events moved onto rank 0's clock, step by step, by one offset found at the "
    "step's all-reduces: no rank ends an all-reduce before every rank has begun it, so "
    "rank 0's start - rank r's end <= offset <= rank 0's end - rank r's start at each; the "
    "offset is the middle of the tightest of these bounds (the steps table's "
    "clock_offset_ms_rank<r>), or where they contradict, the median of rank 0's ends - rank r's"
)
NCCL_ALL_REDUCE = "AllReduce"  # in the name of each of NCCL's all-reduce kernels


def all_reduces(events: Iterable[tuple]) -> list[tuple[float, float]]:
    """(start_us, end_us) of one rank's all-reduces in a step, in order, from its (name,
    category, track, start_us, duration_us) events: its NCCL kernels if any, else host work."""
    kernels, host = [], []
    for name, category, _, start, duration in events:
        if category == "kernel" and NCCL_ALL_REDUCE in name:
            kernels.append((start, start + duration))
        elif name in ALL_REDUCES:
            host.append((start, start + duration))
    return sorted(kernels or host)


def clock_offset_us(reference: list[tuple], other: list[tuple]) -> float | None:
    """What moves `other`'s clock onto `reference`'s (both `all_reduces` of one step, paired in
    order): the middle of the bounds the all-reduces set, else the median of the ends'
    differences (the module's docstring says why). None: no all-reduce to go by."""
    pairs = list(zip(reference, other))
    if not pairs:
        return None
    low = max(start0 - end for (start0, _), (_, end) in pairs)
    high = min(end0 - start for (_, end0), (start, _) in pairs)
    if low <= high:
        return (low + high) / 2
    return float(np.median([end0 - end for (_, end0), (_, end) in pairs]))


def on_rank0_clock(
    events0: list[tuple], others: list[list[tuple]], last: dict
) -> tuple[list[tuple[int, list[tuple]]], list[float]]:
    """One step's events of ranks 1.. (`others[r - 1]`) on rank 0's clock (`events0` are rank
    0's), as (rank, its events) pairs, and the offset each rank's clock was moved by (ms, rank
    0's clock minus the rank's). `last`: rank -> the offset found last, used for a step without
    all-reduces (and updated); a rank with none yet is left out of the step (it cannot be
    placed; its offset NaN)."""
    reference, out, offsets = all_reduces(events0), [], []
    for rank, events in enumerate(others, start=1):
        offset = clock_offset_us(reference, all_reduces(events))
        offset = last.get(rank) if offset is None else offset
        offsets.append(math.nan if offset is None else offset / 1e3)
        if offset is None:
            continue
        last[rank] = offset
        out.append((rank, [(n, c, t, start + offset, d) for n, c, t, start, d in events]))
    return out, offsets


def all_reduce_times(events: pd.DataFrame) -> pd.DataFrame:
    """Each rank's all-reduces of each step from an events table with a `rank` column: step,
    rank, k (its order in the step), start_us, end_us; NCCL's kernels where a rank has them in
    the step, else the host work (as `all_reduces` chooses)."""
    kernel = (events.category == "kernel") & events.name.str.contains(NCCL_ALL_REDUCE, regex=False)
    found = kernel | events.name.isin(ALL_REDUCES)
    times = events.loc[found, ["step", "rank", "start_us"]].assign(
        end_us=events.start_us[found] + events.duration_us[found], kernel=kernel[found]
    )
    has_kernel = times.groupby(["step", "rank"]).kernel.transform("any")
    times = times[times.kernel | ~has_kernel].sort_values(["step", "rank", "start_us"])
    times.insert(2, "k", times.groupby(["step", "rank"]).cumcount())
    return times.drop(columns="kernel").reset_index(drop=True)


def step_skew(events: pd.DataFrame, size: int) -> pd.DataFrame:
    """By step (the index): `rank_skew_ms`, `latest_rank` and `late_ms_rank0`.. of the steps
    whose all-reduces every one of `size` ranks recorded."""
    import pandas as pd

    times = all_reduce_times(events)
    columns = ["rank_skew_ms", "latest_rank", *(f"late_ms_rank{r}" for r in range(size))]
    if times.empty:
        return pd.DataFrame(columns=columns)
    starts = times.pivot_table(index=["step", "k"], columns="rank", values="start_us")
    starts = starts.reindex(columns=range(size)).dropna()  # those every rank recorded
    late = starts.sub(starts.min(axis=1), axis=0) / 1e3  # ms behind the earliest, each
    steps = late.index.get_level_values("step")
    out = late.groupby(steps).sum()
    out.columns = [f"late_ms_rank{r}" for r in range(size)]
    latest = pd.crosstab(steps, late.idxmax(axis=1)).reindex(columns=range(size), fill_value=0)
    # NOTE: a tie of counts goes to the rank later in all (a fraction below 1 breaks it)
    total = out.to_numpy()
    tie = total / (total.sum(axis=1, keepdims=True) + 1.0)
    out["latest_rank"] = (latest.to_numpy() + tie).argmax(axis=1)
    out["rank_skew_ms"] = late.max(axis=1).groupby(steps).sum()
    return out[columns]


def add_skew_columns(steps: pd.DataFrame, events: pd.DataFrame) -> None:
    """A run on several ranks with profiled steps: its steps table gains each step's
    `step_skew` columns (NaN, and <NA> for `latest_rank`, where a step has none)."""
    if not len(steps) or steps.tp_size.max() <= 1 or not steps.profiled.any():
        return
    skew = step_skew(events, int(steps.tp_size.max()))
    for column in skew.columns:
        steps[column] = steps.step.map(skew[column]).astype(
            "Int64" if column == "latest_rank" else "float64"
        )


def residual_us(events: pd.DataFrame) -> float:
    """After alignment: the largest gap between two ranks' ends of one all-reduce (NaN: no
    all-reduce on two ranks)."""
    times = all_reduce_times(events)
    if times.empty or times["rank"].nunique() < 2:
        return math.nan
    ends = times.pivot_table(index=["step", "k"], columns="rank", values="end_us")
    return float((ends.max(axis=1) - ends.min(axis=1)).max())
