"""A sweep of settings in one chart: latency figures against a setting, a twin's runs as lines and
real runs as points. A panel whose values span `LOG_SPAN` times or more is on a log scale."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..history.latency import FIGURES, run_figures
from .common import WIDTH, altair, checked_runs, log_ticks, spans_decades
from .compare import _source
from .noise import repeats_of


def sweep_chart(
    runs: Mapping[str, object],
    x: str = "max_extend_tokens",
    figures: tuple[str, ...] = ("p95 TTFT (ms)", "median ITL (ms)"),
    color: str = "policy",
    column: str | None = None,
    log: bool | None = None,
):
    """Latency figures (`history.latency.FIGURES`) against a setting of the runs' meta (`x`, on
    a log2 axis), a row of panels per figure, a colour per `color` setting and a column per
    `column` setting (in the order the runs give them). A figure's y axis is a log scale where
    its values span `LOG_SPAN` times or more (`log=True`: wherever they are all positive; False:
    never)."""
    alt = altair()
    data = _rows(runs, x, figures, color, column)
    ticks = sorted({int(v) if float(v).is_integer() else float(v) for v in data[x].dropna()})
    low, high = (ticks[0], ticks[-1]) if len(ticks) > 1 else (ticks[0] / 2, ticks[0] * 2)
    x_axis = alt.X(
        f"{x}:Q",
        title=x,
        scale=alt.Scale(type="log", base=2, domain=[low, high], nice=False, padding=8),
        # every value swept, labelled: none dropped for overlap
        axis=alt.Axis(values=ticks, labelOverlap=False, format="d", labelFlush=False),
    )
    panels = []
    for name in figures:
        rows = data[data.figure == name]
        panel = (
            alt.Chart(rows)
            .encode(
                x=x_axis,
                y=_y(alt, name, rows.value.dropna().to_numpy(dtype=float), log),
                color=alt.Color(f"{color}:N", title=color),
                tooltip=[
                    "run:N",
                    "source:N",
                    f"{x}:Q",
                    "figure:N",
                    alt.Tooltip("value:Q", format=".1f"),
                ],
            )
            .properties(width=WIDTH // 2 - 20, height=170)
        )
        lines = panel.transform_filter("datum.source == 'simulated'").mark_line()
        points = panel.transform_filter("datum.source == 'real'").mark_point(filled=True, size=60)
        layer = alt.layer(lines, points)
        if column:
            header = alt.Header(labelExpr=f"'{column} ' + datum.value", labelFontSize=12)
            order = list(dict.fromkeys(data[column].dropna()))
            by = alt.Column(f"{column}:N", title=None, header=header, sort=order)
            layer = layer.facet(column=by)
        panels.append(layer)
    return alt.vconcat(*panels).properties(title="lines: the twin · points: real runs")


def _rows(
    runs: Mapping[str, object],
    x: str = "max_extend_tokens",
    figures: tuple[str, ...] = ("p95 TTFT (ms)", "median ITL (ms)"),
    color: str = "policy",
    column: str | None = None,
) -> pd.DataFrame:
    """One row per run and figure: its value, real or a twin's, its `x`, `color`, `column`."""
    runs = {label: repeats_of(value)[0] for label, value in checked_runs(runs).items()}
    if not isinstance(figures, tuple | list) or not set(figures) <= set(FIGURES):
        raise ValueError(f"figures must be a tuple of FIGURES {FIGURES}, got {figures!r}")
    settings_of = {}
    for label, h in runs.items():
        meta = getattr(h, "meta", {})
        settings_of[label] = {**meta, **(meta.get("settings") or {})}
    for name, key in (("x", x), ("color", color), ("column", column)):
        if key is None and name != "x":
            continue
        if not any(key in settings for settings in settings_of.values()):
            known = sorted({k for s in settings_of.values() for k in s if k != "settings"})
            raise ValueError(f"{name}={key!r} is no setting of these runs; they have {known}")
    rows = []
    for label, h in runs.items():
        meta = getattr(h, "meta", {})
        settings = {**meta, **(meta.get("settings") or {})}
        figure = run_figures(h)
        for name in figures:
            row = {"run": label, "figure": name, "value": figure[name], "source": _source(h)}
            row |= {k: settings.get(k) for k in (x, color, column) if k is not None}
            rows.append(row)
    return pd.DataFrame(rows)


def _y(alt, figure: str, values: np.ndarray, log: bool | None = None):
    if not len(values):
        return alt.Y("value:Q", title=figure, scale=alt.Scale(zero=False))
    low, high = float(values.min()), float(values.max())
    logged = spans_decades(values) if log is None else bool(log) and low > 0
    if logged:
        low, high = low / 1.25, high * 1.25
        return alt.Y(
            "value:Q",
            title=f"{figure}, log scale",
            scale=alt.Scale(type="log", domain=[low, high], nice=False),
            axis=alt.Axis(values=log_ticks(low, high)),
        )
    room = 0.06 * (high - low) or 0.05 * abs(high) or 1.0
    scale = alt.Scale(zero=False, domain=[low - room, high + room], nice=False)
    return alt.Y("value:Q", title=figure, scale=scale)
