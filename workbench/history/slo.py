"""Service-level objectives: an SLO maps any of `SLO_KEYS` to ms. TPOT is vLLM's ``--goodput``
one, ``(E2E - TTFT) / (n - 1)``, ITL a request's longest gap. A request is *good* when it finished
within every limit; goodput is good requests per second, first arrival to last finish."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import validate as V
from .latency import inter_token_latencies

if TYPE_CHECKING:
    import pandas as pd

SLO_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
LABELS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "E2E"}
FINISHED = ("stop", "length")


def check_slo(slo) -> dict[str, float]:
    """The SLO as ``{key: ms}`` in `SLO_KEYS` order; TypeError or ValueError say what is wrong."""
    example = "e.g. {'ttft_ms': 500, 'tpot_ms': 50}"
    if not isinstance(slo, Mapping):
        raise TypeError(f"slo must be a mapping of {SLO_KEYS} to ms ({example}), got {slo!r}")
    if not slo:
        raise ValueError(f"slo is empty: give a limit in ms for any of {SLO_KEYS} ({example})")
    for key in slo:
        if key not in SLO_KEYS:
            raise ValueError(f"slo key {key!r} is not one of {SLO_KEYS} (limits in ms; {example})")
    return {k: V.real(f"slo[{k!r}]", slo[k], 0.0, low_open=True) for k in SLO_KEYS if k in slo}


def slo_verdicts(history, slo: Mapping[str, float]) -> pd.DataFrame:
    """The requests table with `finished`, latencies in ms, a pass column per limit (`ttft_ok`,
    ...), `good`, and `missed` (comma-separated, or "unfinished")."""
    slo = check_slo(slo)
    r = history.requests.copy()
    finished = r.finish_reason.isin(FINISHED).fillna(False).astype(bool) & r.finish_s.notna()
    n = r.completion_tokens
    ttft = r.ttft_s * 1e3
    e2e = ((r.finish_s - r.arrival_s) * 1e3).where(finished)
    # one token: no TPOT and no gap (NaN, as in the requests table), and no limit of theirs missed
    tpot = ((e2e - ttft) / (n - 1)).where(n > 1).where(finished)
    gaps = inter_token_latencies(history.steps, history.ledger) * 1e3
    longest = gaps.groupby(level=0).max() if len(gaps) else gaps
    itl = r.uid.map(longest).astype("float64").fillna(0.0).where(finished & (n > 1))
    r = r.assign(finished=finished, ttft_ms=ttft, tpot_ms=tpot, itl_ms=itl, e2e_ms=e2e)
    good = finished.copy()
    missed = [[] if f else ["unfinished"] for f in finished]
    one_token = finished & (n <= 1)
    for key, limit in slo.items():
        ok = (r[key] <= limit).fillna(False).astype(bool)
        if key in ("tpot_ms", "itl_ms"):
            ok |= one_token
        r[f"{key.removesuffix('_ms')}_ok"] = ok
        good &= ok
        for i in (~ok & finished).to_numpy().nonzero()[0]:
            missed[i].append(key.removesuffix("_ms"))
    return r.assign(good=good, missed=[",".join(m) for m in missed])


def slo_figures(history, slo: Mapping[str, float]) -> dict[str, float]:
    """Goodput (good requests/s), attainment (% good) and each limit's pass rate (%)."""
    slo = check_slo(slo)
    v = slo_verdicts(history, slo)
    span = float(v.finish_s.max() - v.arrival_s.min()) if len(v) else float("nan")
    good = int(v.good.sum())
    figures = {
        "goodput (req/s)": round(good / span, 3) if span > 0 else float("nan"),
        "SLO attainment (%)": round(100.0 * good / len(v), 1) if len(v) else float("nan"),
    }
    for key in slo:
        passed = v[f"{key.removesuffix('_ms')}_ok"]
        figures[f"{LABELS[key]} SLO pass (%)"] = round(100.0 * float(passed.mean()), 1)
    return figures
