"""Why a request missed its SLOs (`slo.py`), from the records: where its delay went.

A missed request's *delay* is the part of its life its missed limits measure: arrival to first
token for TTFT, first token to finish for TPOT and ITL, arrival to finish for E2E (the span of
those it missed). The run's time is cut at each step's completion, step s holding
``(completed_at[s - 1], completed_at[s]]`` (the host's time between steps with it, and with
overlap the next launch), so the delay is the sum of its overlaps with the steps. Each overlap
goes to one cause, by what the step was to the request (`CAUSES`):

- ``queued: <reason>``: it waited to be scheduled, refused for that reason (its admission
  decision of the step: no_token_budget, no_slot, kv_full, queued_behind, decode_first, ...),
  before its first chunk or between two;
- ``queued: arrived mid-step``: it arrived while the step ran, and waited for the next one;
- ``prompt in chunks``: the step ran a chunk of its prompt that was not the last, or it waited
  between chunks with no refusal recorded;
- ``prefill``: the step computed the end of its prompt (and its first token);
- ``decode``: it decoded in a step of decodes alone; in a mixed step, what a decode step
  takes (the run's median decode-only step; none when the run has no such step);
- ``decode slowed by prefill``: the rest of a mixed step, where prompt chunks shared its batch;
- ``decode paused for prefill``: a step ran without it while it was decoding (a prefill step
  that ran first: policy "prefill_first").

So the causes add up to the delay; `miss_causes` gives them per request, `misses_by_cause` in
all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from ..core.admission import REASONS
from .slo import slo_verdicts

if TYPE_CHECKING:
    import pandas as pd

ARRIVED = "queued: arrived mid-step"
CHUNKS, PREFILL = "prompt in chunks", "prefill"
DECODE, SLOWED, PAUSED = "decode", "decode slowed by prefill", "decode paused for prefill"
CAUSES = (*(f"queued: {r}" for r in REASONS), ARRIVED, CHUNKS, PREFILL, DECODE, SLOWED, PAUSED)


def miss_causes(history, slo: Mapping[str, float]) -> pd.DataFrame:
    """One row per request that finished and missed a limit of `slo`: `uid`, `missed` (which
    limits), `delay_ms` (the span they measure), then the ms of each of `CAUSES`; the causes
    of a row add up to its delay. Requests that did not finish have no row."""
    import pandas as pd

    v = slo_verdicts(history, slo)
    missed = v[v.finished & ~v.good]
    steps = history.steps.sort_values("step")
    ends = steps.completed_at.to_numpy(dtype=float)
    starts = np.concatenate([[-np.inf], ends[:-1]])
    span_ms = (ends - starts) * 1e3
    decode_only = (steps.phase == "decode").to_numpy()
    usual_ms = float(np.median(span_ms[1:][decode_only[1:]])) if decode_only[1:].any() else 0.0
    mixed = (steps.phase == "mixed").to_numpy()
    uids = set(missed.uid.tolist())
    ledger = history.ledger[history.ledger.uid.isin(uids)]
    kinds = dict(zip(zip(ledger.uid, ledger.step), ledger.kind))
    a = history.admissions
    a = a[a.uid.isin(uids) & ~a.admitted.astype(bool)]
    refusals = dict(zip(zip(a.uid, a.step), a.reason))
    step_ids = steps.step.to_numpy()
    rows = []
    for r in missed.itertuples(index=False):
        start, end = _window(r)
        causes = dict.fromkeys(CAUSES, 0.0)
        for i, ms in _overlaps(starts, ends, start, end):
            step = int(step_ids[i])
            cause = _cause(r, step, kinds.get((r.uid, step)), refusals.get((r.uid, step)))
            if cause == DECODE and mixed[i]:
                causes[DECODE] += min(ms, usual_ms)
                causes[SLOWED] += ms - min(ms, usual_ms)
            else:
                causes[cause] += ms
        rows.append({"uid": r.uid, "missed": r.missed, "delay_ms": (end - start) * 1e3, **causes})
    return pd.DataFrame(rows, columns=["uid", "missed", "delay_ms", *CAUSES])


def misses_by_cause(history, slo: Mapping[str, float]) -> pd.DataFrame:
    """Each cause of `CAUSES` over every missed request: `ms` in all, `share` (% of all the
    missed requests' delay) and `requests` (how many it held up); the largest first, the
    causes that held up none left out."""
    import pandas as pd

    causes = miss_causes(history, slo)
    total = float(causes.delay_ms.sum())
    rows = [
        {
            "cause": c,
            "ms": float(causes[c].sum()),
            "share": 100.0 * float(causes[c].sum()) / total if total > 0 else float("nan"),
            "requests": int((causes[c] > 0).sum()),
        }
        for c in CAUSES
        if (causes[c] > 0).any()
    ]
    frame = pd.DataFrame(rows, columns=["cause", "ms", "share", "requests"])
    return frame.sort_values("ms", ascending=False, ignore_index=True)


def _window(r) -> tuple[float, float]:
    """The span (seconds on the run's clock) that the limits a request missed measure."""
    missed = set(r.missed.split(","))
    start = r.arrival_s if missed & {"ttft", "e2e"} else r.first_token_s
    end = r.finish_s if missed & {"tpot", "itl", "e2e"} else r.first_token_s
    return float(start), float(end)


def _overlaps(starts: np.ndarray, ends: np.ndarray, start: float, end: float):
    """(row, ms) of each step whose share of the run's time meets [start, end]."""
    first = int(np.searchsorted(ends, start, side="right"))
    last = min(int(np.searchsorted(ends, end, side="left")), len(ends) - 1)
    for i in range(first, last + 1):
        ms = (min(end, ends[i]) - max(start, starts[i])) * 1e3
        if ms > 0:
            yield i, ms


def _cause(r, step: int, kind: str | None, refusal: str | None) -> str:
    """What step `step` was to request `r`, which finished (so it was scheduled and had a
    first token); `kind`: its ledger row's kind in the step, None when it was not in the
    batch; `refusal`: why it was refused then."""
    if kind is not None:
        return {"chunk": CHUNKS, "prefill": PREFILL}.get(kind, DECODE)
    if step > r.first_token_step:
        return PAUSED
    if refusal is not None:
        return f"queued: {refusal}"
    return CHUNKS if step > r.first_scheduled_step else ARRIVED
