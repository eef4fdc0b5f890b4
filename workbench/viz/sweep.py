"""A sweep of settings in one chart: latency figures against a setting (the chunk size by
default), a twin's runs as lines and real runs as points on the same axes."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ..history.latency import run_figures
from .common import WIDTH, altair
from .compare import _source


def sweep_chart(
    runs: Mapping[str, object],
    x: str = "max_extend_tokens",
    figures: tuple[str, ...] = ("p95 TTFT (ms)", "median ITL (ms)"),
    color: str = "policy",
    column: str | None = None,
):
    """Latency figures (`history.latency.FIGURES`) against a setting of the runs (`x`, from
    their meta: the chunk size by default), one colour per `color` setting and one panel per
    `column` setting: a twin's runs as lines, real runs as points on the same axes."""
    alt = altair()
    rows = []
    for label, h in runs.items():
        meta = getattr(h, "meta", {})
        settings = {**meta, **(meta.get("settings") or {})}
        figure = run_figures(h)
        for name in figures:
            row = {"run": label, "figure": name, "value": figure[name], "source": _source(h)}
            row |= {k: settings.get(k) for k in (x, color, column) if k is not None}
            rows.append(row)
    data = pd.DataFrame(rows)
    base = alt.Chart(data).encode(
        x=alt.X(f"{x}:Q", scale=alt.Scale(type="log", base=2), title=x),
        y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
        color=alt.Color(f"{color}:N", title=color),
        tooltip=["run:N", "source:N", f"{x}:Q", "figure:N", alt.Tooltip("value:Q", format=".1f")],
    )
    lines = base.transform_filter("datum.source == 'simulated'").mark_line()
    points = base.transform_filter("datum.source == 'real'").mark_point(filled=True, size=60)
    layer = alt.layer(lines, points).properties(width=WIDTH // 2 - 40, height=160)
    facet = {"row": alt.Row("figure:N", title=None)}
    if column:
        facet["column"] = alt.Column(f"{column}:N")
    return (
        layer.facet(**facet)
        .resolve_scale(y="independent")
        .properties(title="lines: the twin · points: real runs")
    )
