"""What every chart shares: sizes and limits, the step axis, long runs binned, colour scales,
the highlight of one request or step, and the chart that says there is nothing to show."""

from __future__ import annotations

import numpy as np
import pandas as pd

MAX_BARS = 600  # steps shown one bar each; longer runs are binned
MAX_LINES = 60  # requests drawn as lines; more are sampled
MAX_HEIGHT = 480  # pixels of a chart with one row per request
LABELLED_ROWS = 40  # requests whose ids fit along such a chart's axis
MAX_POINTS = 4000  # points of all lines together; longer lines are thinned along the steps

WIDTH = 520


def altair():
    import altair as alt

    return alt


def request_axis(alt, rows: int):
    """An axis of request ids: labelled while they fit, bare beyond (the tooltip names each)."""
    labelled = rows <= LABELLED_ROWS
    return alt.Axis(labels=labelled, ticks=labelled)


def rows_height(rows: int, per_row: int = 16) -> int:
    """A chart with one row per request: readable rows for a few, at most MAX_HEIGHT for many."""
    return max(60, min(per_row * rows, MAX_HEIGHT))


def step_x(alt, field: str = "step", title: str = "step"):
    """A step axis: from 0, whole steps only."""
    return alt.X(
        f"{field}:Q",
        title=title,
        scale=alt.Scale(domainMin=0, nice=False),
        axis=alt.Axis(tickMinStep=1, format="d"),
    )


def binned_steps(steps: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, str]:
    """Steps as they are, or averaged into at most MAX_BARS bins for long runs; `bin` to
    `bin_end` is the span each bar covers."""
    if len(steps) <= MAX_BARS:
        return steps.assign(bin=steps.step, bin_end=steps.step + 1), "step"
    width = int(np.ceil(len(steps) / MAX_BARS))
    frame = steps.assign(bin=steps.step // width * width)
    frame = frame.groupby("bin", as_index=False)[columns].mean()
    return frame.assign(bin_end=frame.bin + width), f"step (mean of {width})"


def color_scale(alt, field: str, colors: dict[str, str], title: str | None = None, legend=None):
    """`field` coloured as `colors` says, whichever values the data has; the legend titled
    `title` (default: the field's name), placed by `legend` (an `alt.Legend`) when given."""
    scale = alt.Scale(domain=list(colors), range=list(colors.values()))
    placed = {} if legend is None else {"legend": legend}
    return alt.Color(f"{field}:N", scale=scale, title=title or field, **placed)


def order_expr(field: str, order: list[str]) -> str:
    return "+".join(f"(datum.{field} == '{v}') * {i}" for i, v in enumerate(order))


def highlight(alt, uid: int | None):
    if uid is None:
        return alt.value(1.0)
    return alt.condition(f"datum.uid == {int(uid)}", alt.value(1.0), alt.value(0.25))


def with_rule(alt, chart, step: int | None, field: str = "bin"):
    """The chart with a dashed rule at `step` (on the same x field, so the axis keeps its title)."""
    if step is None:
        return chart
    rule = alt.Chart(pd.DataFrame({field: [step + 0.5]})).mark_rule(
        color="black", strokeDash=[4, 3]
    )
    return alt.layer(chart, rule.encode(x=f"{field}:Q"))


def empty_chart(alt, message: str):
    return (
        alt.Chart(pd.DataFrame({"text": [message]}))
        .mark_text(align="left", color="#777")
        .encode(text="text:N")
        .properties(width=WIDTH, height=30)
    )
