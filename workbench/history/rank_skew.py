"""Tensor parallelism: how late each rank came to each step's all-reduces, on rank 0's clock
(`rank_skew_ms`: summed over the step's all-reduces; `latest_rank`: last to most of them)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..profiling import ALL_REDUCES
from .rank_clock import NCCL_ALL_REDUCE

if TYPE_CHECKING:
    import pandas as pd


def all_reduce_times(events: pd.DataFrame) -> pd.DataFrame:
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
    """By step: `rank_skew_ms`, `latest_rank`, `late_ms_rank0`.. where all `size` ranks recorded."""
    import pandas as pd

    times = all_reduce_times(events)
    columns = ["rank_skew_ms", "latest_rank", *(f"late_ms_rank{r}" for r in range(size))]
    if times.empty:
        return pd.DataFrame(columns=columns)
    starts = times.pivot_table(index=["step", "k"], columns="rank", values="start_us")
    starts = starts.reindex(columns=range(size)).dropna()  # those every rank recorded
    late = starts.sub(starts.min(axis=1), axis=0) / 1e3
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
    """With several ranks and profiled steps: each step's `step_skew` columns (NA where none)."""
    if not len(steps) or steps.tp_size.max() <= 1 or not steps.profiled.any():
        return
    skew = step_skew(events, int(steps.tp_size.max()))
    for column in skew.columns:
        steps[column] = steps.step.map(skew[column]).astype(
            "Int64" if column == "latest_rank" else "float64"
        )


def residual_us(events: pd.DataFrame) -> float:
    """After alignment: the largest gap between two ranks' ends of one all-reduce (NaN: none)."""
    times = all_reduce_times(events)
    if times.empty or times["rank"].nunique() < 2:
        return math.nan
    ends = times.pivot_table(index=["step", "k"], columns="rank", values="end_us")
    return float((ends.max(axis=1) - ends.min(axis=1)).max())
