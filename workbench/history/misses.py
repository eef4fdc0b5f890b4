"""Why a request missed its SLOs: its delay split over the steps (step s holding
``(completed_at[s - 1], completed_at[s]]``), each share going to one of `CAUSES` by what the step
was to it. A mixed step's decode time beyond the median decode step counts as "slowed"."""

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
    """One row per finished request that missed a limit: `uid`, `missed`, `delay_ms`, then the
    ms of each of `CAUSES`, which add up to the delay."""
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
    """`CAUSES` over the missed requests: `ms`, `share` (%) and `requests`, largest first."""
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
    missed = set(r.missed.split(","))
    start = r.arrival_s if missed & {"ttft", "e2e"} else r.first_token_s
    end = r.finish_s if missed & {"tpot", "itl", "e2e"} else r.first_token_s
    return float(start), float(end)


def _overlaps(starts: np.ndarray, ends: np.ndarray, start: float, end: float):
    first = int(np.searchsorted(ends, start, side="right"))
    last = min(int(np.searchsorted(ends, end, side="left")), len(ends) - 1)
    for i in range(first, last + 1):
        ms = (min(end, ends[i]) - max(start, starts[i])) * 1e3
        if ms > 0:
            yield i, ms


def _cause(r, step: int, kind: str | None, refusal: str | None) -> str:
    """What `step` was to finished request `r`; `kind`: its ledger row's (None: not in batch)."""
    if kind is not None:
        return {"chunk": CHUNKS, "prefill": PREFILL}.get(kind, DECODE)
    if step > r.first_token_step:
        return PAUSED
    if refusal is not None:
        return f"queued: {refusal}"
    return CHUNKS if step > r.first_scheduled_step else ARRIVED
