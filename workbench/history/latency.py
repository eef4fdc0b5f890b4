"""Per-request latency, defined once for the records, the views and the benchmarks. TPOT counts
after the first token, as vLLM and SGLang do: ``(finish - first_token) / (output_tokens - 1)``.
ITL is every gap between consecutive tokens of a request; its percentiles pool all requests'."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def tpot(first_token, finish, output_tokens):
    """TPOT of numbers or Series: None (a Series: NaN) below two tokens."""
    if hasattr(output_tokens, "where"):  # pandas
        return ((finish - first_token) / (output_tokens - 1)).where(output_tokens > 1)
    if finish is None or first_token is None or output_tokens < 2:
        return None
    return (finish - first_token) / (output_tokens - 1)


def inter_token_latencies(steps: pd.DataFrame, ledger: pd.DataFrame) -> pd.Series:
    """Seconds between consecutive tokens of each request, indexed by uid; a token arrives when
    the step that sampled it completes."""
    import pandas as pd

    sampled = ledger.loc[ledger.token.notna(), ["uid", "step"]]
    done_at = pd.Series(steps.completed_at.to_numpy(), index=steps.step.to_numpy())
    tokens = sampled.assign(at=sampled.step.map(done_at)).sort_values(["uid", "step"])
    gaps = tokens.groupby("uid", sort=False).at.diff()
    itl = pd.Series(gaps.to_numpy(), index=tokens.uid.to_numpy(), name="itl_s", dtype="float64")
    return itl[gaps.notna().to_numpy()].rename_axis("uid")


FIGURES = (
    "p50 TTFT (ms)",
    "p95 TTFT (ms)",
    "median ITL (ms)",
    "p95 ITL (ms)",
    "TPOT (ms)",
    "E2E (ms)",
    "throughput (tok/s)",
)


def run_seconds(requests: pd.DataFrame) -> float:
    """A run's length as throughput counts it: first arrival to last finish (as vLLM, SGLang)."""
    if requests.empty or requests.finish_s.isna().all():
        return 0.0
    return float(requests.finish_s.max() - requests.arrival_s.min())


def output_throughput(requests: pd.DataFrame) -> float:
    """Completion tokens over `run_seconds` (NaN: no time)."""
    seconds = run_seconds(requests)
    return float(requests.completion_tokens.sum() / seconds) if seconds > 0 else float("nan")


def run_figures(history) -> dict[str, float]:
    """A run's `FIGURES`: ITL's percentiles over every gap, the others' over requests."""
    r, steps = history.requests, history.steps
    itl_ms = inter_token_latencies(steps, history.ledger) * 1e3
    ttft_ms, e2e_ms = r.ttft_s * 1e3, (r.finish_s - r.arrival_s) * 1e3
    values = (
        ttft_ms.quantile(0.5),
        ttft_ms.quantile(0.95),
        itl_ms.median(),
        itl_ms.quantile(0.95),
        (r.tpot_s * 1e3).median(),
        e2e_ms.median(),
        output_throughput(r),
    )
    return {name: float(v) for name, v in zip(FIGURES, values)}
