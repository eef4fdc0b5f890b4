"""Charts of the steps: what each batch held, the KV pool, and where each step's time went
(profiler events, record="full")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..history.families import breakdown_table, family
from ..palette import (
    DEVICE_COLOR,
    FAMILY_COLORS,
    HOOK_COLORS,
    KIND_COLORS,
    KV_COLORS,
    NOT_PROFILED_COLOR,
    STAGE_COLORS,
)
from ..timing import DEVICE_STAGES, add_timing_columns, device_on_host
from .causes import counted, number
from .common import (
    MAX_BARS,
    NO_STEPS,
    WIDTH,
    altair,
    binned_steps,
    chart_function,
    color_scale,
    empty_chart,
    order_expr,
    step_x,
    with_rule,
)


@chart_function
def batch_composition(history, highlight_step: int | None = None):
    """Tokens computed per step, stacked by kind: chunk, full prefill, decode, and padding."""
    alt = altair()
    if history.steps.empty:
        return empty_chart(alt, NO_STEPS)
    cols = ["chunk_tokens", "prefill_tokens", "decode_tokens", "padding_tokens"]
    frame, x_title = binned_steps(history.steps, cols)
    long = frame.melt(
        id_vars=["bin", "bin_end"], value_vars=cols, var_name="kind", value_name="tokens"
    )
    long["kind"] = long.kind.str.removesuffix("_tokens")
    chart = (
        alt.Chart(long)
        .mark_bar(stroke="white", strokeWidth=0.2)
        .encode(
            x=step_x(alt, "bin", x_title),
            x2="bin_end:Q",
            y=alt.Y("sum(tokens):Q", title="tokens in the batch"),
            color=color_scale(alt, "kind", KIND_COLORS),
            order=alt.Order("kind_order:Q"),
            tooltip=["bin:Q", "kind:N", "tokens:Q"],
        )
        .transform_calculate(kind_order=order_expr("kind", list(KIND_COLORS)))
    )
    return with_rule(alt, chart, highlight_step).properties(
        width=WIDTH, height=160, title="Batch composition per step"
    )


@chart_function
def kv_usage(history, highlight_step: int | None = None):
    """The KV pool over steps: in use by live requests, cached and evictable, free."""
    alt = altair()
    if history.steps.empty:
        return empty_chart(alt, NO_STEPS)
    cols = ["kv_in_use", "kv_evictable", "kv_free"]
    frame, x_title = binned_steps(history.steps, cols)
    long = frame.melt(
        id_vars=["bin", "bin_end"], value_vars=cols, var_name="state", value_name="tokens"
    )
    long["state"] = long.state.map(
        {"kv_in_use": "in use", "kv_evictable": "evictable", "kv_free": "free"}
    )
    total = int(history.steps.kv_total.max())
    used = history.steps.kv_in_use + history.steps.kv_evictable
    title = "KV pool"
    if used.max() < 0.2 * total:  # a big, mostly empty pool: show what is used, state the rest
        long = long[long.state != "free"]
        title = f"KV pool (in use and evictable, of {total:,} slots)"
    # NOTE: each bin's value holds until the next bin ("step-after"); the last one is repeated
    # at its end, so the last step (and a run of one step) is an area, not a point.
    last = long[long.bin == long.bin.max()]
    long = pd.concat([long.assign(x=long.bin), last.assign(x=last.bin_end)])
    chart = (
        alt.Chart(long)
        .mark_area(interpolate="step-after")
        .encode(
            x=step_x(alt, "x", x_title),
            y=alt.Y("tokens:Q", stack="zero", title="KV slots (tokens)"),
            color=color_scale(alt, "state", KV_COLORS),
            order=alt.Order("state_order:Q"),
            tooltip=["bin:Q", "state:N", "tokens:Q"],
        )
        .transform_calculate(state_order=order_expr("state", list(KV_COLORS)))
    )
    return with_rule(alt, chart, highlight_step, "x").properties(
        width=WIDTH, height=140, title=title
    )


@chart_function
def step_times(history, highlight_step: int | None = None):
    """Each step's host time by stage (bars) against its device time (black), as `workbench.timing`
    defines them: a step is host-bound where the bars rise above the line. On the CPU the forward
    and sampling are the device's work (the line), not among the bars."""
    alt = altair()
    steps = history.steps
    if steps.empty:
        return empty_chart(alt, NO_STEPS)
    on_host = device_on_host(history)
    if "host_bound" not in steps:
        steps = add_timing_columns(steps.copy(), on_host)
    own = [s for s in STAGE_COLORS if not (on_host and s in DEVICE_STAGES)]
    names = {f"host_{stage}_ms": stage for stage in own}
    colors = {stage: STAGE_COLORS[stage] for stage in own}
    if not set(names) <= set(steps.columns) or steps[list(names)].isna().all().all():
        # saved before the split: the host's own work whole
        names, colors = {"host_work_ms": "host"}, {"host": STAGE_COLORS["forward"]}
    columns = list(dict.fromkeys([*names, "device_ms", "host_work_ms"]))
    frame, x_title = binned_steps(steps, columns)
    long = frame.melt(
        id_vars=["bin", "bin_end"], value_vars=list(names), var_name="stage", value_name="ms"
    )
    long["stage"] = long.stage.map(names)
    bars = (
        alt.Chart(long)
        .mark_bar(stroke="white", strokeWidth=0.2)
        .encode(
            x=step_x(alt, "bin", x_title),
            x2="bin_end:Q",
            y=alt.Y("sum(ms):Q", title="ms"),
            color=color_scale(alt, "stage", colors),
            order=alt.Order("stage_order:Q"),
            tooltip=["bin:Q", "stage:N", alt.Tooltip("ms:Q", format=".3f")],
        )
        .transform_calculate(stage_order=order_expr("stage", list(colors)))
    )
    device_title = "forward and sampling (ms)" if on_host else "device (ms)"
    device = (
        alt.Chart(frame)
        .mark_rule(color=DEVICE_COLOR, strokeWidth=1.5)
        .encode(
            x=step_x(alt, "bin", x_title),
            x2="bin_end:Q",
            y=alt.Y("device_ms:Q", title="ms"),
            tooltip=[
                "bin:Q",
                alt.Tooltip("device_ms:Q", format=".3f", title=device_title),
                alt.Tooltip("host_work_ms:Q", format=".3f", title="host's own work (ms)"),
            ],
        )
    )
    bound = int(steps.host_bound.fillna(False).astype(bool).sum())
    # NOTE: short lines: a title wider than the chart widens it (the dashboard is narrow)
    title = [
        "Host's own work by stage, the device's in black",
        f"host-bound in {number(bound)} of {counted(len(steps), 'step')}",
    ]
    if on_host:
        title.append("on the CPU the device's work is the forward and sampling")
    return with_rule(alt, alt.layer(bars, device), highlight_step).properties(
        width=WIDTH, height=150, title=title
    )


@chart_function
def kernel_timeline(history, step: int, max_events: int = 1500):
    """A Gantt chart of one step (record='full'): hook ranges in lanes of their own, coloured by
    hook; operators and kernels below, coloured by kernel family."""
    alt = altair()
    events = history.events[history.events.step == step]
    if events.empty:
        if not history.events.empty:  # a window chose other steps
            return empty_chart(alt, f"step {step} was not profiled (profile_steps chose others)")
        return empty_chart(alt, f"step {step}: profiler events are recorded with record='full'")
    if len(events) > max_events:
        events = events.nlargest(max_events, "duration_us")
    hook = (events.category == "hook").to_numpy()
    t0 = events.start_us.min()
    events = events.assign(
        family=[n if h else family(n, c) for n, c, h in zip(events.name, events.category, hook)],
        start_ms=(events.start_us - t0) / 1e3,
        end_ms=(events.start_us - t0 + events.duration_us) / 1e3,
        lane=np.where(hook, "hooks · " + events.track, events.track + " · " + events.category),
    )
    lanes = sorted(events.lane.unique(), key=lambda lane: (not lane.startswith("hooks"), lane))
    base = (
        alt.Chart(events)
        .mark_bar()
        .encode(
            y=alt.Y("lane:N", title=None, sort=lanes),
            x=alt.X(
                "start_ms:Q",
                title="ms since the step began",
                axis=alt.Axis(labelOverlap=True, tickCount=8),
            ),
            x2="end_ms:Q",
            tooltip=["name:N", "category:N", "family:N", "duration_us:Q"],
        )
    )
    # NOTE: the hooks' legend above the chart: two legends side by side (the dashboard puts
    # legends below, in a row) would make the chart twice as wide
    above = alt.Legend(orient="top", direction="horizontal", columns=3)
    hooks = base.transform_filter("datum.category == 'hook'").encode(
        color=color_scale(alt, "family", HOOK_COLORS, "hook range", legend=above)
    )
    work = base.transform_filter("datum.category != 'hook'").encode(
        color=color_scale(alt, "family", FAMILY_COLORS, "kernel family")
    )
    return (
        alt.layer(hooks, work)
        .resolve_scale(color="independent")
        .properties(width=WIDTH, height=160, title=f"Timeline of step {step}")
    )


@chart_function
def step_breakdown(history, highlight_step: int | None = None):
    """Per step: device time by kernel family, between kernels and idle (`breakdown_table`); an
    unprofiled step is an outlined bar of its span, and the roofline bound a black line."""
    alt = altair()
    frame = breakdown_table(history)
    if frame.empty:
        return empty_chart(alt, "profiler events are recorded with record='full'")
    steps = history.steps
    if "span_ms" not in steps:
        steps = add_timing_columns(steps.copy(), device_on_host(history))
    profiled = frame.step.unique()
    unprofiled = steps.loc[~steps.step.isin(profiled), ["step", "span_ms"]]
    if len(unprofiled):
        rest = pd.DataFrame(
            {"step": unprofiled.step, "family": "not profiled", "ms": unprofiled.span_ms}
        )
        frame = pd.concat([frame, rest], ignore_index=True)
    width = max(1, int(np.ceil(steps.step.nunique() / MAX_BARS)))
    bound = _bounds(steps, profiled, width)
    if width > 1:  # a bar is the mean step of its bin: each family's ms over every step in it
        frame = frame.assign(step=frame.step // width * width)
        in_bin = steps.assign(step=steps.step // width * width).groupby("step").size()
        frame = frame.groupby(["step", "family"], as_index=False).ms.sum()
        frame["ms"] = frame.ms / frame.step.map(in_bin)
    frame = frame.assign(step_end=frame.step + width)
    colors = {**FAMILY_COLORS, "not profiled": NOT_PROFILED_COLOR}
    present = {f: c for f, c in colors.items() if f in set(frame.family)}
    chart = (
        alt.Chart(frame)
        .mark_bar(stroke="#999999", strokeWidth=0.3)
        .encode(
            x=step_x(alt, "step", "step" if width == 1 else f"step (mean of {width})"),
            x2="step_end:Q",
            y=alt.Y("sum(ms):Q", title="ms"),
            color=color_scale(alt, "family", present),
            order=alt.Order("family_order:Q"),
            tooltip=["step:Q", "family:N", alt.Tooltip("ms:Q", format=".2f")],
        )
        .transform_calculate(family_order=order_expr("family", list(present)))
    )
    title = ["Where each step's time went"]  # short lines: a wide title widens the chart
    if device_on_host(history):
        title.append("on the CPU the kernels are the forward's operators")
    if len(unprofiled):
        title.append(f"{number(len(profiled))} of {counted(len(steps), 'step')} profiled")
    if bound is not None:
        # NOTE: one level segment per bar (x to x2), so the line follows the bars also where
        # only some steps were profiled
        line = (
            alt.Chart(bound)
            .mark_rule(color="black", strokeWidth=1.5)
            .encode(
                x=step_x(alt),
                x2="step_end:Q",
                y=alt.Y("bound_ms:Q", title="ms"),
                tooltip=["step:Q", alt.Tooltip("bound_ms:Q", format=".4f", title="bound (ms)")],
            )
        )
        chart = alt.layer(chart, line)
        title.append("black: the roofline bound")
    return with_rule(alt, chart, highlight_step, "step").properties(
        width=WIDTH, height=150, title=title
    )


def _bounds(steps: pd.DataFrame, profiled, width: int) -> pd.DataFrame | None:
    """The profiled steps' roofline bound, binned like the bars (None: the run has none)."""
    if "bound_ms" not in steps or steps.bound_ms.isna().all():
        return None
    frame = steps.loc[steps.step.isin(profiled) & steps.bound_ms.notna(), ["step", "bound_ms"]]
    if width > 1:
        frame = frame.assign(step=frame.step // width * width)
        frame = frame.groupby("step", as_index=False).bound_ms.mean()
    return frame.assign(step_end=frame.step + width)


def has_ranks(history) -> bool:
    """Whether the run was split over ranks (its steps table has their device times)."""
    return "device_ms_rank1" in history.steps.columns


@chart_function
def rank_times(history, highlight_step: int | None = None):
    """Each rank's device time per step: the lines part where one rank waits for another (an
    all-reduce) or its GPU does other work."""
    alt = altair()
    steps = history.steps
    cols = ["device_ms"] + sorted(
        (c for c in steps.columns if c.startswith("device_ms_rank")), key=lambda c: int(c[14:])
    )
    if len(cols) == 1:
        return empty_chart(alt, "one rank: device times per rank come with tp_size > 1")
    frame, x_title = binned_steps(steps, cols)
    long = frame.melt(id_vars=["bin"], value_vars=cols, var_name="rank", value_name="ms")
    long["rank"] = long["rank"].map(lambda c: "rank 0" if c == "device_ms" else f"rank {c[14:]}")
    # NOTE: ranks doing the same work draw the same line: each rank has its own dash and point
    # shape too, so every one stays visible where they coincide, and the title says how close
    spread = float((frame[cols].max(axis=1) - frame[cols].min(axis=1)).max())
    chart = (
        alt.Chart(long)
        .mark_line(point=True, interpolate="step-after", strokeWidth=1.5)
        .encode(
            x=step_x(alt, "bin", x_title),
            y=alt.Y("ms:Q", title="device ms"),
            color=alt.Color("rank:N", title="rank"),
            strokeDash=alt.StrokeDash("rank:N", title="rank"),
            shape=alt.Shape("rank:N", title="rank"),
            tooltip=["bin:Q", "rank:N", alt.Tooltip("ms:Q", format=".3f")],
        )
    )
    title = f"Device time of each rank per step ({len(cols)} ranks, "
    title += "no times yet)" if np.isnan(spread) else f"at most {spread:.3f} ms apart)"
    return with_rule(alt, chart, highlight_step).properties(width=WIDTH, height=150, title=title)
