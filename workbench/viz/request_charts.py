"""Charts of the requests: each one's ledger at a step and over the steps, the page table of a
batch, and the admission decisions."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..palette import DECISION_COLORS, LEDGER_PART_COLORS, PAGE_OWNER_COLORS
from .common import (
    LABELLED_ROWS,
    MAX_LINES,
    MAX_POINTS,
    WIDTH,
    altair,
    chart_function,
    color_scale,
    empty_chart,
    highlight,
    request_axis,
    rows_height,
    step_x,
    with_rule,
)

OWNERS = tuple(PAGE_OWNER_COLORS)  # own, shared, prefix cache: sharing_segments' codes


@chart_function
def ledger_bars(history, step: int, highlight_uid: int | None = None):
    """At one step, each request in the batch as one bar: cached before the step | computed by
    it (`extend`) | room left up to prompt + max_tokens (`remain`)."""
    alt = altair()
    rows = history.ledger[history.ledger.step == step]
    if rows.empty:
        return empty_chart(alt, f"step {step}: no batch")
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
    opacity = highlight(alt, highlight_uid)
    n = rows.uid.nunique()
    return (
        alt.Chart(parts)
        .mark_bar(stroke="#555", strokeWidth=0.3 if n <= LABELLED_ROWS else 0)
        .encode(
            y=alt.Y("uid:O", title="request", axis=request_axis(alt, n)),
            x=alt.X("start:Q", title="tokens (prompt + max_tokens)"),
            x2="end:Q",
            color=color_scale(alt, "part", LEDGER_PART_COLORS),
            opacity=opacity,
            tooltip=["uid:O", "kind:N", "part:N", "start:Q", "end:Q", "tokens:Q"],
        )
        .properties(width=WIDTH, height=rows_height(n), title=f"Ledgers at step {step}")
    )


@chart_function
def ledger_lines(history, highlight_uid: int | None = None, highlight_step: int | None = None):
    """Each request's cached_len over the steps it ran in (one line per request)."""
    alt = altair()
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
            x=step_x(alt),
            y=alt.Y("cached_len:Q", title="cached_len"),
            color=alt.Color("uid:N", title="request", legend=alt.Legend(columns=4, symbolLimit=24)),
            opacity=highlight(alt, highlight_uid),
            tooltip=["step:Q", "uid:N", "kind:N", "cached_len:Q"],
        )
    )
    return with_rule(alt, chart, highlight_step, "step").properties(
        width=WIDTH, height=160, title=title
    )


@chart_function
def page_table(history, step: int, highlight_uid: int | None = None):
    """The page-table rows of one step's batch: each request's token positions, coloured by whose
    KV slots they are: shared within the batch, the prefix cache's, or its own."""
    alt = altair()
    pages = getattr(history, "pages", None)
    rows = history.pages_at(step) if pages is not None and len(pages) else None
    if rows is None or rows.empty:
        return empty_chart(alt, f"step {step}: page rows are recorded with record='full'")
    ledger = history.ledger[history.ledger.step == step]
    segments = sharing_segments(rows, dict(zip(ledger.uid, ledger.cached_tokens)))
    shown = segments.uid.nunique()
    whom = "the request" if shown == 1 else f"the {shown} requests"
    title = f"Page table at step {step}: {whom} of its batch, one row each"
    return (
        alt.Chart(segments)
        .mark_bar(stroke="white", strokeWidth=0.4)
        .encode(
            y=alt.Y(
                "label:N",
                title="request (row)",
                sort=alt.SortField("uid"),
                axis=request_axis(alt, segments.uid.nunique()),
            ),
            x=alt.X("pos_start:Q", title="token position"),
            x2="pos_end:Q",
            color=color_scale(alt, "owner", PAGE_OWNER_COLORS),
            opacity=highlight(alt, highlight_uid),
            tooltip=["uid:O", "table_idx:O", "pos_start:Q", "pos_end:Q", "slot_start:Q", "owner:N"],
        )
        .properties(
            width=WIDTH,
            height=rows_height(segments.uid.nunique()),
            title=title,
        )
    )


@chart_function
def admissions(history, highlight_uid: int | None = None):
    """Which waiting requests were considered at each step, and why they waited."""
    alt = altair()
    frame = history.admissions.assign(
        decision=lambda f: f.reason.astype("object").where(~f.admitted, "admitted")
    )
    if frame.empty:
        return empty_chart(alt, "no admission decisions")
    if len(frame) > 4000:
        frame = frame.groupby(["step", "decision"], as_index=False).size()
        return (
            alt.Chart(frame)
            .mark_bar()
            .encode(
                x=step_x(alt),
                y=alt.Y("size:Q", title="requests"),
                color=color_scale(alt, "decision", DECISION_COLORS),
            )
            .properties(width=WIDTH, height=140, title="Admission decisions")
        )
    return (
        alt.Chart(frame.assign(step_end=frame.step + 1))
        .mark_rect()
        .encode(
            x=step_x(alt),
            x2="step_end:Q",
            y=alt.Y("uid:O", title="request", axis=request_axis(alt, frame.uid.nunique())),
            color=color_scale(alt, "decision", DECISION_COLORS),
            opacity=highlight(alt, highlight_uid),
            tooltip=["step:O", "uid:O", "decision:N", "extend_len:Q", "cached_len:Q"],
        )
        .properties(width=WIDTH, height=rows_height(frame.uid.nunique(), 14), title="Admissions")
    )


def sharing_segments(rows: pd.DataFrame, cached: dict[int, int]) -> pd.DataFrame:
    """Split each slot run where its owner changes: "shared" where another row holds the slot,
    else "prefix cache" for a request's first `cached[uid]` positions, else "own"."""
    lens = (rows.pos_end - rows.pos_start).to_numpy()
    run = np.repeat(np.arange(len(rows)), lens)  # the slot run of each position
    offset = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    pos = rows.pos_start.to_numpy()[run] + offset
    slot = rows.slot_start.to_numpy()[run] + offset
    _, inverse, counts = np.unique(slot, return_inverse=True, return_counts=True)
    matched = rows.uid.map(cached).fillna(0).to_numpy()[run]
    owner = np.where(counts[inverse] > 1, 1, np.where(pos < matched, 2, 0))  # OWNERS' indices
    first = np.ones(len(pos), dtype=bool)  # where a segment starts: a new run or a new owner
    first[1:] = (run[1:] != run[:-1]) | (owner[1:] != owner[:-1])
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], len(pos))
    frame = pd.DataFrame(
        {
            "uid": rows.uid.to_numpy()[run[starts]],
            "table_idx": rows.table_idx.to_numpy()[run[starts]],
            "pos_start": pos[starts],
            "pos_end": pos[ends - 1] + 1,
            "slot_start": slot[starts],
            "owner": np.array(OWNERS, dtype=object)[owner[starts]],
        }
    )
    frame["label"] = [f"#{u} (row {t})" for u, t in zip(frame.uid, frame.table_idx)]
    return frame
