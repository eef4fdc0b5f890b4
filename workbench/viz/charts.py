"""Altair charts: pure functions from a run history to a chart.

A history is anything with the tables `steps`, `ledger`, `requests`, `admissions`, `events` and
`pages` (a live `History` or a loaded `RunHistory`). Nothing here needs the engine, and nothing
loads from the network. Long runs are aggregated before they reach Altair (its row limit is
5,000 and a browser wants far fewer marks than that).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

KIND_COLORS = {"chunk": "#f4a261", "prefill": "#2a9d8f", "decode": "#457b9d", "padding": "#cccccc"}
KV_COLORS = {"in use": "#e76f51", "evictable": "#e9c46a", "free": "#a8dadc"}
FAMILY_COLORS = {
    "attention": "#264653",
    "matmul": "#2a9d8f",
    "sampling": "#e9c46a",
    "norm/rope/act": "#f4a261",
    "other": "#b0b0b0",
    "idle": "#eeeeee",
}
HOOK_COLORS = {
    "schedule.end": "#6d597a",
    "batch.prepared": "#b56576",
    "forward.end": "#355070",
    "sample.end": "#eaac8b",
    "step.end": "#9a8c98",
}
MAX_BARS = 600  # steps shown one bar each; longer runs are binned
MAX_LINES = 60  # requests drawn as lines; more are sampled
MAX_HEIGHT = 480  # pixels of a chart with one row per request
LABELLED_ROWS = 40  # requests whose ids fit along such a chart's axis
MAX_POINTS = 4000  # points of all lines together; longer lines are thinned along the steps

WIDTH = 520


def _alt():
    import altair as alt

    return alt


def _request_axis(alt, rows: int):
    """An axis of request ids: labelled while they fit, bare beyond (the tooltip names each)."""
    labelled = rows <= LABELLED_ROWS
    return alt.Axis(labels=labelled, ticks=labelled)


def _rows_height(rows: int, per_row: int = 16) -> int:
    """A chart with one row per request: readable rows for a few, at most MAX_HEIGHT for many."""
    return max(60, min(per_row * rows, MAX_HEIGHT))


def _step_x(alt, field: str = "step", title: str = "step"):
    """A step axis: from 0, whole steps only."""
    return alt.X(
        f"{field}:Q",
        title=title,
        scale=alt.Scale(domainMin=0, nice=False),
        axis=alt.Axis(tickMinStep=1, format="d"),
    )


def _binned_steps(steps: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, str]:
    """Steps as they are, or averaged into at most MAX_BARS bins for long runs; `bin` to
    `bin_end` is the span each bar covers."""
    if len(steps) <= MAX_BARS:
        return steps.assign(bin=steps.step, bin_end=steps.step + 1), "step"
    width = int(np.ceil(len(steps) / MAX_BARS))
    frame = steps.assign(bin=steps.step // width * width)
    frame = frame.groupby("bin", as_index=False)[columns].mean()
    return frame.assign(bin_end=frame.bin + width), f"step (mean of {width})"


def batch_composition(history, highlight_step: int | None = None):
    """Tokens computed per step, stacked by kind: chunk, full prefill, decode, and padding."""
    alt = _alt()
    cols = ["chunk_tokens", "prefill_tokens", "decode_tokens", "padding_tokens"]
    frame, x_title = _binned_steps(history.steps, cols)
    long = frame.melt(
        id_vars=["bin", "bin_end"], value_vars=cols, var_name="kind", value_name="tokens"
    )
    long["kind"] = long.kind.str.removesuffix("_tokens")
    chart = (
        alt.Chart(long)
        .mark_bar(stroke="white", strokeWidth=0.2)
        .encode(
            x=_step_x(alt, "bin", x_title),
            x2="bin_end:Q",
            y=alt.Y("sum(tokens):Q", title="tokens in the batch"),
            color=_scale(alt, "kind", KIND_COLORS),
            order=alt.Order("kind_order:Q"),
            tooltip=["bin:Q", "kind:N", "tokens:Q"],
        )
        .transform_calculate(kind_order=_order_expr("kind", list(KIND_COLORS)))
    )
    return _with_rule(alt, chart, highlight_step).properties(
        width=WIDTH, height=160, title="Batch composition per step"
    )


def kv_usage(history, highlight_step: int | None = None):
    """The KV pool over steps: in use by live requests, cached and evictable, free."""
    alt = _alt()
    cols = ["kv_in_use", "kv_evictable", "kv_free"]
    frame, x_title = _binned_steps(history.steps, cols)
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
            x=_step_x(alt, "x", x_title),
            y=alt.Y("tokens:Q", stack="zero", title="KV slots (tokens)"),
            color=_scale(alt, "state", KV_COLORS),
            order=alt.Order("state_order:Q"),
            tooltip=["bin:Q", "state:N", "tokens:Q"],
        )
        .transform_calculate(state_order=_order_expr("state", list(KV_COLORS)))
    )
    return _with_rule(alt, chart, highlight_step, "x").properties(
        width=WIDTH, height=140, title=title
    )


def ledger_bars(history, step: int, highlight_uid: int | None = None):
    """At one step, each request in the batch as one bar: cached | computed now | still to come.

    `cached` is what was in the pool before the step, `extend` what the step computed, `remain`
    the room left up to prompt + max_tokens."""
    alt = _alt()
    rows = history.ledger[history.ledger.step == step]
    if rows.empty:
        return _empty(alt, f"step {step}: no batch")
    before = rows.cached_len - rows.extend_len
    parts = pd.concat(
        [
            pd.DataFrame({"uid": rows.uid, "part": "cached", "start": 0, "end": before}),
            pd.DataFrame(
                {"uid": rows.uid, "part": "extend", "start": before, "end": rows.cached_len}
            ),
            pd.DataFrame(
                {
                    "uid": rows.uid,
                    "part": "remain",
                    "start": rows.cached_len,
                    "end": rows.max_device_len,
                }
            ),
        ]
    )
    parts["kind"] = parts.uid.map(dict(zip(rows.uid, rows.kind)))
    parts["tokens"] = parts.end - parts.start
    colors = {"cached": "#8d99ae", "extend": "#e63946", "remain": "#edf2f4"}
    opacity = _highlight(alt, highlight_uid)
    n = rows.uid.nunique()
    return (
        alt.Chart(parts)
        .mark_bar(stroke="#555", strokeWidth=0.3 if n <= LABELLED_ROWS else 0)
        .encode(
            y=alt.Y("uid:O", title="request", axis=_request_axis(alt, n)),
            x=alt.X("start:Q", title="tokens (prompt + max_tokens)"),
            x2="end:Q",
            color=_scale(alt, "part", colors),
            opacity=opacity,
            tooltip=["uid:O", "kind:N", "part:N", "start:Q", "end:Q", "tokens:Q"],
        )
        .properties(width=WIDTH, height=_rows_height(n), title=f"Ledgers at step {step}")
    )


def ledger_lines(history, highlight_uid: int | None = None, highlight_step: int | None = None):
    """Each request's cached_len over the steps it ran in (one line per request)."""
    alt = _alt()
    ledger = history.ledger[["step", "uid", "cached_len", "kind"]]
    uids = sorted(ledger.uid.unique())
    title = "Lengths over steps"
    if len(uids) > MAX_LINES:  # many requests: a sample of them, and always the picked one
        keep = set(uids[:: -(-len(uids) // MAX_LINES)]) | {highlight_uid}
        ledger = ledger[ledger.uid.isin(keep)]
        title += f" ({ledger.uid.nunique()} of {len(uids)} requests)"
    if len(ledger) > MAX_POINTS:  # long lines: every k-th step, and each line's two ends
        lines = ledger.uid.nunique()
        stride = -(-len(ledger) // (MAX_POINTS - 2 * lines))
        ends = ~ledger.uid.duplicated() | ~ledger.uid.duplicated(keep="last")
        ledger = ledger[(ledger.step % stride == 0) | ends]
        title += f" (one point every {stride} steps)"
    chart = (
        alt.Chart(ledger)
        .mark_line(point=len(ledger) < 400)
        .encode(
            x=_step_x(alt),
            y=alt.Y("cached_len:Q", title="cached_len"),
            color=alt.Color("uid:N", title="request", legend=alt.Legend(columns=4, symbolLimit=24)),
            opacity=_highlight(alt, highlight_uid),
            tooltip=["step:Q", "uid:N", "kind:N", "cached_len:Q"],
        )
    )
    return _with_rule(alt, chart, highlight_step, "step").properties(
        width=WIDTH, height=160, title=title
    )


def page_table(history, step: int, highlight_uid: int | None = None):
    """The page-table rows of one step's batch: token positions of each request, coloured by
    whose KV slots they are: the prefix cache's (matched when the request was admitted), shared
    with another request of the batch, or its own."""
    alt = _alt()
    pages = getattr(history, "pages", None)
    rows = pages[pages.step == step] if pages is not None and len(pages) else None
    if rows is None or rows.empty:
        return _empty(alt, f"step {step}: page rows are recorded with record='full'")
    ledger = history.ledger[history.ledger.step == step]
    segments = _sharing_segments(rows, dict(zip(ledger.uid, ledger.cached_tokens)))
    colors = {"own": "#457b9d", "shared": "#e76f51", "prefix cache": "#e9c46a"}
    return (
        alt.Chart(segments)
        .mark_bar(stroke="white", strokeWidth=0.4)
        .encode(
            y=alt.Y(
                "label:N",
                title="request (row)",
                sort=alt.SortField("uid"),
                axis=_request_axis(alt, segments.uid.nunique()),
            ),
            x=alt.X("pos_start:Q", title="token position"),
            x2="pos_end:Q",
            color=_scale(alt, "owner", colors),
            opacity=_highlight(alt, highlight_uid),
            tooltip=["uid:O", "table_idx:O", "pos_start:Q", "pos_end:Q", "slot_start:Q", "owner:N"],
        )
        .properties(
            width=WIDTH,
            height=_rows_height(segments.uid.nunique()),
            title=f"Page table at step {step} (slot runs)",
        )
    )


def admissions(history, highlight_uid: int | None = None):
    """Which waiting requests were considered at each step, and why they waited."""
    alt = _alt()
    frame = history.admissions.assign(
        decision=lambda f: f.reason.astype("object").where(~f.admitted, "admitted")
    )
    if frame.empty:
        return _empty(alt, "no admission decisions")
    if len(frame) > 4000:
        frame = frame.groupby(["step", "decision"], as_index=False).size()
        return (
            alt.Chart(frame)
            .mark_bar()
            .encode(x=_step_x(alt), y=alt.Y("size:Q", title="requests"), color="decision:N")
            .properties(width=WIDTH, height=140, title="Admission decisions")
        )
    return (
        alt.Chart(frame.assign(step_end=frame.step + 1))
        .mark_rect()
        .encode(
            x=_step_x(alt),
            x2="step_end:Q",
            y=alt.Y("uid:O", title="request", axis=_request_axis(alt, frame.uid.nunique())),
            color=alt.Color("decision:N", scale=alt.Scale(scheme="tableau10")),
            opacity=_highlight(alt, highlight_uid),
            tooltip=["step:O", "uid:O", "decision:N", "extend_len:Q", "cached_len:Q"],
        )
        .properties(width=WIDTH, height=_rows_height(frame.uid.nunique(), 14), title="Admissions")
    )


def kernel_timeline(history, step: int, max_events: int = 1500):
    """A Gantt chart of one step: profiler ranges and kernels by track (record='full')."""
    alt = _alt()
    events = history.events[history.events.step == step]
    if events.empty:
        return _empty(alt, f"step {step}: profiler events are recorded with record='full'")
    # hook ranges are coloured by their name, operators and kernels by family
    families = [n if c == "hook" else _family(n, c) for n, c in zip(events.name, events.category)]
    events = events.assign(family=families)
    if len(events) > max_events:  # keep the longest
        events = events.nlargest(max_events, "duration_us")
    t0 = events.start_us.min()
    events = events.assign(
        start_ms=(events.start_us - t0) / 1e3,
        end_ms=(events.start_us - t0 + events.duration_us) / 1e3,
        lane=events.track + " · " + events.category.astype(str),  # ranges apart from operators
    )
    return (
        alt.Chart(events)
        .mark_bar()
        .encode(
            y=alt.Y("lane:N", title=None),
            x=alt.X("start_ms:Q", title="ms since the step began"),
            x2="end_ms:Q",
            color=_scale(alt, "family", {**FAMILY_COLORS, **HOOK_COLORS}),
            tooltip=["name:N", "category:N", "family:N", "duration_us:Q"],
        )
        .properties(width=WIDTH, height=160, title=f"Timeline of step {step}")
    )


def step_breakdown(history, highlight_step: int | None = None):
    """Per step: device time by kernel family (attention, matmul, sampling, ...) and idle."""
    alt = _alt()
    frame = breakdown_table(history)
    if frame.empty:
        return _empty(alt, "profiler events are recorded with record='full'")
    width = max(1, int(np.ceil(frame.step.nunique() / MAX_BARS)))
    if width > 1:
        frame = frame.assign(step=frame.step // width * width)
        frame = frame.groupby(["step", "family"], as_index=False).ms.mean()
    frame = frame.assign(step_end=frame.step + width)
    chart = (
        alt.Chart(frame)
        .mark_bar(stroke="white", strokeWidth=0.2)
        .encode(
            x=_step_x(alt),
            x2="step_end:Q",
            y=alt.Y("sum(ms):Q", title="ms"),
            color=_scale(alt, "family", FAMILY_COLORS),
            tooltip=["step:Q", "family:N", alt.Tooltip("ms:Q", format=".2f")],
        )
    )
    return _with_rule(alt, chart, highlight_step, "step").properties(
        width=WIDTH, height=150, title="Where each step's time went"
    )


def breakdown_table(history) -> pd.DataFrame:
    """ms per (step, family): kernels on a GPU, leaf operators on a CPU; `idle` fills up to the
    step's wall time."""
    events = history.events
    if events.empty:
        return pd.DataFrame(columns=["step", "family", "ms"])
    on_gpu = (events.category == "kernel").any()
    leaf = events[events.category == "kernel"] if on_gpu else events[events.name.isin(_CPU_LEAVES)]
    leaf = leaf.assign(family=[_family(n, c) for n, c in zip(leaf.name, leaf.category)])
    busy = leaf.groupby(["step", "family"], as_index=False).duration_us.sum()
    busy["ms"] = busy.duration_us / 1e3
    wall = history.steps.set_index("step").wall_ms
    total = busy.groupby("step").ms.sum()
    idle = (wall.reindex(total.index) - total).clip(lower=0)
    idle_rows = pd.DataFrame({"step": idle.index, "family": "idle", "ms": idle.values})
    return pd.concat([busy[["step", "family", "ms"]], idle_rows], ignore_index=True)


# -- helpers --------------------------------------------------------------------------------
_FAMILIES = [
    ("attention", re.compile(r"attention|flash|BatchDecode|BatchPrefill|sdpa|fmha", re.I)),
    (
        "sampling",
        re.compile(r"softmax|argmax|exponential|sampling|multinomial|topk|sort|uniform|rand", re.I),
    ),
    (
        "matmul",
        re.compile(r"gemm|nvjet|cutlass|\bmm\b|aten::mm|addmm|bmm|matmul|linear|sm90_xmma", re.I),
    ),
    ("norm/rope/act", re.compile(r"norm|rsqrt|rope|rotary|silu|act_and_mul|pow|mean", re.I)),
]
_CPU_LEAVES = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_attention_math",
    "aten::_softmax",
    "aten::argmax",
    "aten::exponential_",
    "aten::uniform_",
    "aten::log",
    "aten::log_",
    "aten::div",
    "aten::mul",
    "aten::add",
    "aten::silu",
    "aten::pow",
    "aten::mean",
    "aten::rsqrt",
    "aten::index",
    "aten::index_copy_",
    "aten::cat",
    "aten::copy_",
    "aten::embedding",
    "aten::index_select",
    "aten::neg",
    "aten::neg_",
    "aten::sub",
    "aten::sub_",
}


def _family(name: str, category: str) -> str:
    if category == "hook":
        return "hook"
    for family, pattern in _FAMILIES:
        if pattern.search(name):
            return family
    return "other"


def _sharing_segments(rows: pd.DataFrame, cached: dict[int, int]) -> pd.DataFrame:
    """Split each request's slot runs where their owner changes: the prefix cache (its first
    `cached[uid]` positions, matched at admission), shared with another row, or its own."""
    slot_count: dict[int, int] = {}
    for r in rows.itertuples(index=False):
        for s in range(r.slot_start, r.slot_start + r.pos_end - r.pos_start):
            slot_count[s] = slot_count.get(s, 0) + 1
    out = []
    for r in rows.itertuples(index=False):
        matched = cached.get(r.uid, 0)
        owner = [
            "prefix cache"
            if r.pos_start + i < matched
            else "shared"
            if slot_count[s] > 1
            else "own"
            for i, s in enumerate(range(r.slot_start, r.slot_start + r.pos_end - r.pos_start))
        ]
        start = 0
        for i in range(1, len(owner) + 1):
            if i == len(owner) or owner[i] != owner[start]:
                out.append(
                    (
                        r.uid,
                        r.table_idx,
                        r.pos_start + start,
                        r.pos_start + i,
                        r.slot_start + start,
                        owner[start],
                    )
                )
                start = i
    frame = pd.DataFrame(
        out, columns=["uid", "table_idx", "pos_start", "pos_end", "slot_start", "owner"]
    )
    frame["label"] = [f"#{u} (row {t})" for u, t in zip(frame.uid, frame.table_idx)]
    return frame


def _scale(alt, field: str, colors: dict[str, str]):
    return alt.Color(
        f"{field}:N", scale=alt.Scale(domain=list(colors), range=list(colors.values())), title=field
    )


def _order_expr(field: str, order: list[str]) -> str:
    return "+".join(f"(datum.{field} == '{v}') * {i}" for i, v in enumerate(order))


def _highlight(alt, uid: int | None):
    if uid is None:
        return alt.value(1.0)
    return alt.condition(f"datum.uid == {int(uid)}", alt.value(1.0), alt.value(0.25))


def _with_rule(alt, chart, step: int | None, field: str = "bin"):
    """The chart with a dashed rule at `step` (on the same x field, so the axis keeps its title)."""
    if step is None:
        return chart
    rule = alt.Chart(pd.DataFrame({field: [step + 0.5]})).mark_rule(
        color="black", strokeDash=[4, 3]
    )
    return alt.layer(chart, rule.encode(x=f"{field}:Q"))


def _empty(alt, message: str):
    return (
        alt.Chart(pd.DataFrame({"text": [message]}))
        .mark_text(align="left", color="#777")
        .encode(text="text:N")
        .properties(width=WIDTH, height=30)
    )
