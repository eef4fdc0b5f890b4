"""`bench --slo ttft:500,tpot:50`: the run against service-level objectives: goodput, attainment,
each limit's pass rate, and the missed requests' delay by cause."""

from __future__ import annotations

import argparse

from ..history.misses import miss_causes, misses_by_cause
from ..history.slo import SLO_KEYS, check_slo, slo_figures

NAMES = {key.removesuffix("_ms"): key for key in SLO_KEYS} | {"e2el": "e2e_ms"}  # (vLLM's)


def parse_slo(text: str) -> dict[str, float]:
    """``ttft:500,tpot:50`` as ``{"ttft_ms": 500.0, "tpot_ms": 50.0}`` (an argparse type)."""
    slo = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, colon, ms = part.partition(":")
        key = NAMES.get(name.strip().lower())
        if key is None or not colon:
            raise argparse.ArgumentTypeError(
                f"{part!r}: each limit is NAME:MS with NAME one of {sorted(NAMES)} "
                "(e.g. ttft:500,tpot:50)"
            )
        try:
            slo[key] = float(ms)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: {ms!r} is not a number of ms") from None
    try:
        return check_slo(slo)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def slo_result(history, slo: dict[str, float]) -> dict:
    """What `--json` prints of the SLO: the limits, the figures, the misses and their causes."""
    causes = miss_causes(history, slo)
    by_cause = misses_by_cause(history, slo)
    return {
        "limits_ms": slo,
        **slo_figures(history, slo),
        "requests": len(history.requests),
        "missed": len(causes),
        "unfinished": int((~history.requests.finish_reason.isin(["stop", "length"])).sum()),
        "missed_delay_ms": round(float(causes.delay_ms.sum()), 1),
        "misses_by_cause": {
            row.cause: {
                "ms": round(row.ms, 1),
                "share": round(row.share, 1),
                "requests": row.requests,
            }
            for row in by_cause.itertuples(index=False)
        },
    }


def print_slo(r: dict) -> None:
    """The lines `bench --slo` prints."""
    limits = ", ".join(f"{k.removesuffix('_ms')} {v:g} ms" for k, v in r["limits_ms"].items())
    passes = ", ".join(f"{k.split()[0]} {v:.1f}%" for k, v in r.items() if "SLO pass" in k)
    print(
        f"SLO {limits}: goodput {r['goodput (req/s)']:.3f} req/s, attainment "
        f"{r['SLO attainment (%)']:.1f}% ({r['requests'] - r['missed'] - r['unfinished']} of "
        f"{r['requests']} requests met every limit); pass rate {passes}"
    )
    if not r["missed"]:
        return
    print(
        f"misses by cause ({r['missed']} requests missed, {r['missed_delay_ms']:,.0f} ms of "
        "delay in all: the span each missed limit measures):"
    )
    for cause, c in r["misses_by_cause"].items():
        print(
            f"  {cause:<28} {c['ms']:>10,.1f} ms  {c['share']:5.1f}%  in {c['requests']} requests"
        )
