"""What every chart shares: sizes and limits, the step axis, binning, colours, highlights."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping

import numpy as np
import pandas as pd

from .. import validate as V

MAX_BARS = 600  # steps shown one bar each; longer runs are binned
MAX_LINES = 60  # requests drawn as lines; more are sampled
MAX_HEIGHT = 480  # pixels of a chart with one row per request
LABELLED_ROWS = 40  # requests whose ids fit along such a chart's axis
MAX_POINTS = 4000  # points of all lines together; longer lines are thinned along the steps

WIDTH = 520
LOG_SPAN = 100  # values whose largest is this many times their smallest go on a log scale


NO_STEPS = "no steps recorded (yet, or record='off')"


def as_history(value, what: str = "history"):
    """A run's history: `value` itself (`wb.history`, `load_run`'s, `compare`'s), or the run so
    far of a Workbench or LLM; anything else a TypeError naming `what`."""
    if hasattr(value, "steps"):  # (a history, or what stands for one: its tables)
        return value
    history = getattr(value, "history", None)
    if history is not None and hasattr(history, "steps"):
        return history
    raise TypeError(
        f"{what} must be a run's history (wb.history, load_run(path), a run compare returned) "
        f"or a Workbench or LLM, got {type(value).__name__} {value!r:.60}"
    )


def checked_runs(runs, what: str = "runs", empty: bool = False) -> dict:
    """Runs by name, each a history or its repeats (a list): a mapping, non-empty unless
    `empty` (a table of none is empty; a chart of none has no axis)."""
    if not isinstance(runs, Mapping):
        raise TypeError(
            f"{what} must be a mapping of names to runs (as compare returns), got "
            f"{type(runs).__name__} {runs!r:.60}"
        )
    if not runs and not empty:
        raise ValueError(f"{what} is empty: give at least one run by name")
    return {
        str(label): [as_history(h, f"{what}[{label!r}]") for h in value]
        if isinstance(value, list | tuple)
        else as_history(value, f"{what}[{label!r}]")
        for label, value in runs.items()
    }


def check_step(history, step, name: str = "step") -> int:
    """`step` as an index of one of `history`'s recorded steps."""
    if isinstance(step, bool) or not isinstance(step, int | np.integer):
        raise TypeError(f"{name} must be a step's index (an integer), got {step!r}")
    steps = history.steps.step
    if len(steps) and not (steps == step).any():
        raise ValueError(
            f"{name}={step} is not a recorded step of this run (steps {int(steps.min())} to "
            f"{int(steps.max())})"
        )
    return int(step)


def check_optional_index(value, name: str) -> int | None:
    """None, or an integer (a step or request id to highlight)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer or None, got {value!r}")
    return int(value)


def chart_function(function):
    """A chart of one run as users call it: its history (or a Workbench's or an LLM's run so
    far), the step it draws and the step or request it highlights checked first."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def call(history, *args, **kwargs):
        bound = signature.bind(as_history(history), *args, **kwargs)
        history = bound.arguments["history"]
        for name, value in bound.arguments.items():
            if name == "step":
                bound.arguments[name] = check_step(history, value)
            elif name in ("highlight_step", "highlight_uid"):
                bound.arguments[name] = check_optional_index(value, name)
            elif name == "max_events":
                bound.arguments[name] = V.integer(name, value, 1)
        return function(*bound.args, **bound.kwargs)

    return call


def check_recorded(history, what: str) -> None:
    """Raise ValueError naming `what` where `history` holds no step (a run with record="off"):
    the views read steps, and would fail on an empty table in pandas' words instead."""
    if len(history.steps):
        return
    record = getattr(history, "meta", {}).get("record")
    why = "it ran with record='off'" if record == "off" else "it recorded no step"
    raise ValueError(f"{what} has no step records ({why}): run it with record='light' or 'full'")


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
    return alt.X(
        f"{field}:Q",
        title=title,
        scale=alt.Scale(domainMin=0, nice=False),
        axis=alt.Axis(tickMinStep=1, format="d"),
    )


def binned_bar(alt, x_title: str) -> dict:
    """The encoding of a bar per (binned) step that is not stacked: from `bin` to `bin_end`,
    rising from zero (a bar with x and x2 is drawn as a line at y unless y2 says where from)."""
    return dict(x=step_x(alt, "bin", x_title), x2="bin_end:Q", y2=alt.datum(0))


def binned_steps(steps: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, str]:
    """Steps as they are, or averaged into at most MAX_BARS bins; a bar spans `bin` to `bin_end`."""
    if len(steps) <= MAX_BARS:
        return steps.assign(bin=steps.step, bin_end=steps.step + 1), "step"
    width = int(np.ceil(len(steps) / MAX_BARS))
    frame = steps.assign(bin=steps.step // width * width)
    frame = frame.groupby("bin", as_index=False)[columns].mean()
    return frame.assign(bin_end=frame.bin + width), f"step (mean of {width})"


def color_scale(alt, field: str, colors: dict[str, str], title: str | None = None, legend=None):
    """`field` coloured as `colors` says, whichever values the data has."""
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


def spans_decades(values: np.ndarray) -> bool:
    """Whether values need a log scale: all positive, the largest `LOG_SPAN` times the smallest."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    return len(values) > 0 and bool((values > 0).all()) and values.max() >= LOG_SPAN * values.min()


def log_ticks(low: float, high: float) -> list[float]:
    """Powers of ten from `low` to `high`, with 2 and 5 times them over fewer than three decades."""
    steps = (1,) if np.log10(high / low) >= 3 else (1, 2, 5)
    decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
    return [m * 10.0**d for d in decades for m in steps if low <= m * 10.0**d <= high]


def fitted_y(alt, field: str, title: str, values):
    """A y encoding fitted to `values`: linear from zero, or log (its title says so)."""
    values = np.asarray(values, dtype=float)
    if not spans_decades(values):
        return alt.Y(f"{field}:Q", title=title)
    low, high = float(np.nanmin(values)) / 1.25, float(np.nanmax(values)) * 1.25
    return alt.Y(
        f"{field}:Q",
        title=f"{title}, log scale",
        scale=alt.Scale(type="log", domain=[low, high], nice=False),
        axis=alt.Axis(values=log_ticks(low, high)),
    )


_CDN_NOTED = False


def vega_offline(warn: bool = True) -> bool:
    """Whether charts can draw without a network: vl-convert-python (the notebook extra) carries
    Vega's JavaScript. Without it they load Vega from a CDN; `warn`: say so, once a process."""
    global _CDN_NOTED
    try:
        import vl_convert  # noqa: F401
    except ImportError:
        if warn and not _CDN_NOTED:
            _CDN_NOTED = True
            import warnings

            warnings.warn(
                "vl-convert-python is not installed, so charts load Vega from a CDN and stay "
                "blank without a network; pip install vl-convert-python to draw them offline",
                stacklevel=2,
            )
        return False
    return True
