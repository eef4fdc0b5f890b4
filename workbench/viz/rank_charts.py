"""Charts of a run split over ranks: how late the latest rank came to each step's all-reduces."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .common import MAX_BARS, WIDTH, altair, binned_bar, chart_function, empty_chart, with_rule


def has_rank_skew(history) -> bool:
    """Whether the steps table has the ranks' skew (tp_size > 1, record="full")."""
    return "rank_skew_ms" in history.steps.columns


@chart_function
def rank_skew(history, highlight_step: int | None = None):
    """Each profiled step's `rank_skew_ms` (how long the latest rank kept the others waiting at
    its all-reduces), coloured by the rank that came last most often; long runs binned."""
    alt = altair()
    steps = history.steps
    if not has_rank_skew(history):
        return empty_chart(alt, "no skew: it comes with tp_size > 1 and record='full'")
    frame = steps.loc[steps.rank_skew_ms.notna(), ["step", "rank_skew_ms", "latest_rank"]]
    if frame.empty:
        return empty_chart(alt, "no profiled step has every rank's all-reduces")
    frame, x_title = _binned(frame.astype({"latest_rank": "int64"}))
    frame["latest"] = [f"rank {r}" for r in frame.latest_rank]
    chart = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            **binned_bar(alt, x_title),
            y=alt.Y("rank_skew_ms:Q", title="skew ms"),
            color=alt.Color("latest:N", title="latest rank"),
            tooltip=[
                alt.Tooltip("bin:Q", title="step"),
                alt.Tooltip("rank_skew_ms:Q", format=".3f", title="skew (ms)"),
                alt.Tooltip("latest:N", title="latest rank"),
            ],
        )
    )
    shares = frame.latest.value_counts(normalize=True)
    title = (
        f"Skew at the all-reduces per step (median {frame.rank_skew_ms.median():.3f} ms; "
        f"latest most often: {shares.index[0]}, {shares.iloc[0]:.0%} of the bars)"
    )
    return with_rule(alt, chart, highlight_step).properties(width=WIDTH, height=150, title=title)


def _binned(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The steps as they are, or in at most MAX_BARS bins: mean skew, most frequent latest rank."""
    if len(frame) <= MAX_BARS:
        return frame.assign(bin=frame.step, bin_end=frame.step + 1), "step"
    width = int(np.ceil((frame.step.max() + 1) / MAX_BARS))
    groups = frame.assign(bin=frame.step // width * width).groupby("bin")
    binned = pd.DataFrame(
        {
            "rank_skew_ms": groups.rank_skew_ms.mean(),
            "latest_rank": groups.latest_rank.agg(lambda r: r.mode().iloc[0]),
        }
    ).reset_index()
    return binned.assign(bin_end=binned.bin + width), f"step (mean of {width})"
