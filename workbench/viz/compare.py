"""Comparing runs of the same requests under different settings. `runs` maps a label to a history.
Latencies are in steps as well as ms: steps do not depend on the machine or on its load."""

from __future__ import annotations

import math
from collections.abc import Mapping
from html import escape

import numpy as np
import pandas as pd

from .. import validate as V
from ..history.families import breakdown_table
from ..history.latency import inter_token_latencies, tpot
from ..history.slo import check_slo, slo_figures
from ..timing import DEVICE_MEANING, device_on_host
from .causes import run_causes
from .common import WIDTH, altair, binned_steps, check_recorded, checked_runs, fitted_y
from .noise import (
    PERCENTILES,
    combine,
    repeats_of,
    run_spreads,
    same_setting_floor,
    same_setting_groups,
)
from .report import summary

# compare_table's default columns, in reading order; one name a figure (p50, not also "median")
SHORT = (
    "output tokens/s",
    "p50 TTFT (ms)",
    "p99 TTFT (ms)",
    "p50 ITL (ms)",
    "p99 ITL (ms)",
    "p50 TPOT (ms)",
    "p99 TPOT (ms)",
    "mean TTFT (steps)",
    "steps",
    "prefill steps",
    "mixed steps",
    "decode steps",
    "mean step wall (ms)",
    "device busy (%)",
    "host-bound steps",
    "queued (s)",
)


def request_latencies(history) -> pd.DataFrame:
    """Per request: time to first token and time per output token, in steps and in ms.

    `ttft_steps` includes the first token's step; `tpot_steps` is 1.0 for a request never paused."""
    r = history.requests
    return pd.DataFrame(
        {
            "uid": r.uid,
            "ttft_steps": r.first_token_step - r.arrival_step + 1,
            "tpot_steps": tpot(r.first_token_step, r.finish_step, r.completion_tokens),
            "ttft_ms": r.ttft_s * 1e3,
            "tpot_ms": r.tpot_s * 1e3,
        }
    )


def compare_table(
    runs: Mapping[str, object], full: bool = False, slo: Mapping[str, float] | None = None
) -> pd.DataFrame:
    """One row per setting, the columns of `SHORT` (`full=True`: every figure some run has), and
    a "<figure> ±" column of each figure's noise (`viz.noise`). A value of `runs` is a history or
    its repeats (a sequence, or a history with `repeats`): figures are then means over them.
    `slo` (ms limits, `history.slo`) adds goodput, attainment and each limit's pass rate."""
    slo = None if slo is None else check_slo(slo)
    runs = checked_runs(runs, empty=True)
    full = V.boolean("full", full)
    rows, spreads, slo_columns = {}, {}, {}
    for label, value in runs.items():
        repeats = repeats_of(value)
        figures = []
        for history in repeats:
            check_recorded(history, f"run {label!r}")
            row = _row(history)
            if slo is not None:
                extra = slo_figures(history, slo)
                row.update(extra)
                slo_columns.update(dict.fromkeys(extra))
            figures.append(row)
        own = [
            run_spreads(h, row, repeats[:i] + repeats[i + 1 :])
            for i, (h, row) in enumerate(zip(repeats, figures))
        ]
        rows[label], spreads[label] = combine(figures, own)
        rows[label]["repeats"] = len(repeats)
    table = pd.DataFrame.from_dict(rows, orient="index")
    spread = pd.DataFrame.from_dict(spreads, orient="index")
    groups = same_setting_groups({label: repeats_of(v)[0] for label, v in runs.items()})
    for name, share in same_setting_floor(table, groups).items():
        if name in spread:
            floor = share * pd.to_numeric(table[name], errors="coerce").abs()
            spread[name] = pd.concat([spread[name], floor], axis=1).max(axis=1)
    names = list(table.columns) if full else [*SHORT, *slo_columns, "repeats"]
    if full:
        names = [n for n in names if table[n].notna().any()]
    columns = {}
    for name in names:
        columns[name] = table[name] if name in table else pd.Series(None, index=table.index)
        if name in spread and spread[name].notna().any():
            columns[f"{name} ±"] = spread[name]
    result = ComparisonTable(columns, index=table.index)
    if any(device_on_host(repeats_of(v)[0]) for v in runs.values()):
        # what "device" means in its columns, as the summary's sentence says it
        said = [n for n in ("device busy (%)", "host-bound steps") if n in result]
        if said:
            result.attrs["note"] = f"{' and '.join(said)}: {DEVICE_MEANING[True]}"
    return result


class ComparisonTable(pd.DataFrame):
    """`compare_table`'s result: numbers, each figure's noise in a "<figure> ±" column; a notebook
    shows both in one cell ("134 ± 8.2"), as `shown()` gives them."""

    @property
    def _constructor(self):
        return ComparisonTable

    def shown(self) -> pd.DataFrame:
        """Each figure with its noise in one cell, as text (integers as integers)."""
        cells = {}
        for name in self.columns:
            if str(name).endswith(" ±"):
                continue
            noise = self[f"{name} ±"] if f"{name} ±" in self.columns else None
            cells[name] = [
                _cell(value, None if noise is None else noise.iloc[i])
                for i, value in enumerate(self[name])
            ]
        return pd.DataFrame(cells, index=self.index)

    @property
    def note(self) -> str | None:
        """What a column's figure means where it differs by machine (a CPU's "device")."""
        return self.attrs.get("note")

    def _repr_html_(self) -> str:
        with pd.option_context("display.max_columns", None, "display.width", None):
            html = self.shown()._repr_html_()
        return html + (f"<p><small>{escape(self.note)}</small></p>" if self.note else "")

    def __repr__(self) -> str:
        with pd.option_context("display.max_columns", None, "display.width", None):
            text = repr(self.shown())
        return text + (f"\n{self.note}" if self.note else "")


def _cell(value, noise) -> str:
    if value is None or (_numeric(value) and math.isnan(float(value))):
        return ""
    said = _number(value)
    if noise is not None and not pd.isna(noise) and _numeric(value):
        said += f" ± {_number(noise)}"
    return said


def _numeric(value) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _number(value) -> str:
    if not _numeric(value):
        return str(value)
    if float(value).is_integer() and isinstance(value, int | np.integer):
        return f"{int(value):,}"
    value = float(value)
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return (
        f"{value:.1f}"
        if abs(value) >= 10
        else f"{value:.2f}"
        if abs(value) >= 1
        else f"{value:.2g}"
    )


def _row(history) -> dict:
    """Every figure of one run (`compare_table(..., full=True)`)."""
    lat = request_latencies(history)
    steps = history.steps
    itl_ms = inter_token_latencies(steps, history.ledger) * 1e3
    causes = run_causes(history)
    row = summary(history)
    row.update(
        {
            "mean TTFT (steps)": round(float(lat.ttft_steps.mean()), 2),
            "p90 TTFT (steps)": float(lat.ttft_steps.quantile(0.9)),
            "mean steps per output token": round(float(lat.tpot_steps.mean()), 3),
            "steps per prompt": round(causes.steps_per_prompt, 2),
            **_percentiles("TTFT", lat.ttft_ms),
            **_percentiles("TPOT", lat.tpot_ms),
            **_percentiles("ITL", itl_ms),
            "mean step wall (ms)": round(float(steps.wall_ms.mean()), 3),
            "mean step device (ms)": round(float(steps.device_ms.mean()), 3),
            "mean step host (ms)": _mean(steps, "host_ms"),
            # the profiler's own estimate of what it added (its sessions' stops in the steps
            # after them too), per step it profiled
            "profiler ms per profiled step": _profiler_per_step(steps),
            "mean step bound (ms)": _mean(steps, "bound_ms"),
            "mean achieved GB/s": _mean(steps, "achieved_gbps"),
            "bound / device time": _bound_share(steps),
            "device busy (%)": round(100 * causes.device_share, 1),
            "host-bound steps": causes.host_bound,
            "queued (s)": round(causes.queued_s, 3),
        }
    )
    breakdown = breakdown_table(history)
    if not breakdown.empty:
        per_step = breakdown.groupby("family").ms.sum() / breakdown.step.nunique()
        row.update({f"{family} ms/step": round(float(ms), 3) for family, ms in per_step.items()})
    return row


def _mean(steps: pd.DataFrame, column: str) -> float | None:
    """A column's mean, or None for runs saved before the column existed."""
    return round(float(steps[column].mean()), 3) if column in steps else None


def _profiler_per_step(steps: pd.DataFrame) -> float | None:
    if "profiler_ms" not in steps or not steps.profiled.any():
        return _mean(steps, "profiler_ms")  # (None, or NaN: nothing profiled)
    return round(float(steps.profiler_ms.sum() / steps.profiled.sum()), 3)


def _percentiles(name: str, ms: pd.Series) -> dict[str, float]:
    return {f"p{q} {name} (ms)": round(float(ms.quantile(q / 100)), 2) for q in PERCENTILES}


def _bound_share(steps: pd.DataFrame) -> float | None:
    """Roofline time over device time of the steps with a bound (1.0: all at their roofline)."""
    if "bound_ms" not in steps:
        return None
    bounded = steps[steps.bound_ms.notna()]
    device_ms = bounded.device_ms.sum()
    return round(float(bounded.bound_ms.sum() / device_ms), 3) if device_ms > 0 else float("nan")


def compare_chart(runs: Mapping[str, object], unit: str = "steps"):
    """Each request's time to first token, side by side per run; tokens per step and the
    waiting queue over steps, one line per run (of a setting run several times, its first).
    `unit`: "steps" or "ms" for the latencies."""
    if unit not in ("steps", "ms"):
        raise ValueError(f"unit must be 'steps' or 'ms', got {unit!r}")
    runs = checked_runs(runs)
    counts = {len(repeats_of(value)) for value in runs.values()}
    runs = {label: repeats_of(value)[0] for label, value in runs.items()}
    for label, history in runs.items():
        check_recorded(history, f"run {label!r}")
    # a chart of one run a setting says so, where the table beside it is the mean of several
    n = str(max(counts)) if len(counts) == 1 else f"{min(counts)} to {max(counts)}"
    of = "" if counts == {1} else f" (the first of each setting's {n} runs)"
    alt = altair()
    labels = list(runs)
    run_scale = alt.Scale(domain=labels)
    source = {label: _source(h) for label, h in runs.items()}
    sources = alt.Scale(domain=["real", "simulated"], range=[[1, 0], [5, 3]])
    lat = pd.concat(
        [request_latencies(h).assign(run=label, source=source[label]) for label, h in runs.items()],
        ignore_index=True,
    )
    ttft = (
        alt.Chart(lat)
        .mark_bar()
        .encode(
            x=alt.X("uid:O", title="request"),
            xOffset=alt.XOffset("run:N", scale=run_scale),
            y=fitted_y(alt, f"ttft_{unit}", f"time to first token ({unit})", lat[f"ttft_{unit}"]),
            color=alt.Color("run:N", scale=run_scale, title="run"),
            opacity=alt.Opacity(
                "source:N",
                scale=alt.Scale(domain=["real", "simulated"], range=[1.0, 0.55]),
                title="run is",
            ),
            tooltip=["run:N", "source:N", "uid:O", "ttft_steps:Q", "ttft_ms:Q", "tpot_steps:Q"],
        )
        .properties(width=WIDTH, height=160, title="Time to first token, per request" + of)
    )
    cols = ["num_tokens", "queue_len", "running"]
    steps = pd.concat(
        [
            binned_steps(h.steps, cols)[0].assign(run=label, source=source[label])
            for label, h in runs.items()
        ],
        ignore_index=True,
    )
    base = alt.Chart(steps).encode(
        x=alt.X("bin:Q", title="step"),
        color=alt.Color("run:N", scale=run_scale, title="run"),
        strokeDash=alt.StrokeDash("source:N", scale=sources, title="run is"),
    )
    tokens = (
        base.mark_line(interpolate="step-after")
        .encode(
            y=fitted_y(alt, "num_tokens", "tokens in the batch", steps.num_tokens),
            tooltip=["run:N", "bin:Q"],
        )
        .properties(width=WIDTH, height=130, title="Tokens per step" + of)
    )
    queue = (
        base.mark_line(interpolate="step-after")
        .encode(y=alt.Y("queue_len:Q", title="waiting requests"), tooltip=["run:N", "bin:Q"])
        .properties(width=WIDTH, height=110, title="Queue length" + of)
    )
    return alt.vconcat(ttft, tokens, queue).resolve_scale(color="shared")


def _source(history) -> str:
    """ "simulated" for a twin's run (`workbench.twin`), else "real"."""
    return "simulated" if getattr(history, "meta", {}).get("simulated") else "real"
