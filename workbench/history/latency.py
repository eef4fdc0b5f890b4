"""Per-request latency, defined once: the records, the views and the benchmarks all use these.

TPOT (time per output token) is measured after the first token, as vLLM and SGLang report it:
``(finish - first_token) / (output_tokens - 1)``; a request with fewer than two tokens has none.
ITL (inter-token latency) is every gap between two consecutive tokens of one request, from the
first token on; its percentiles are taken over the gaps of all requests together.
The arguments may be numbers (seconds, or steps) or pandas Series of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def tpot(first_token, finish, output_tokens):
    """Time per output token after the first: None for a number below two tokens (or a missing
    finish); for Series, NaN where a request has fewer than two tokens."""
    if hasattr(output_tokens, "where"):  # pandas
        return ((finish - first_token) / (output_tokens - 1)).where(output_tokens > 1)
    if finish is None or first_token is None or output_tokens < 2:
        return None
    return (finish - first_token) / (output_tokens - 1)


def inter_token_latencies(steps: pd.DataFrame, ledger: pd.DataFrame) -> pd.Series:
    """Seconds between consecutive tokens of each request (vLLM's and SGLang's ITL), indexed by
    uid: one gap per token after a request's first. A token arrives when the step that sampled
    it completes (`steps.completed_at`); the ledger says which step gave which request a token
    (`token` not null).

    A request's gaps add up to its last token minus its first, so their mean over all requests,
    weighted by tokens, equals TPOT when each request's finish is its last token; the median
    ITL and the median TPOT (a mean per request, then a median over requests) differ in
    general, and ITL's tail shows the pauses that a request's mean smooths out."""
    import pandas as pd

    sampled = ledger.loc[ledger.token.notna(), ["uid", "step"]]
    done_at = pd.Series(steps.completed_at.to_numpy(), index=steps.step.to_numpy())
    tokens = sampled.assign(at=sampled.step.map(done_at)).sort_values(["uid", "step"])
    gaps = tokens.groupby("uid", sort=False).at.diff()
    itl = pd.Series(gaps.to_numpy(), index=tokens.uid.to_numpy(), name="itl_s", dtype="float64")
    return itl[gaps.notna().to_numpy()].rename_axis("uid")


# a run's headline latency figures (`run_figures`), in ms except throughput
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
    """A run's length as its throughput counts it: from the first request's arrival to the
    last one's finish (vLLM's and SGLang's benchmark duration); 0 for a run of no requests."""
    if requests.empty or requests.finish_s.isna().all():
        return 0.0
    return float(requests.finish_s.max() - requests.arrival_s.min())


def output_throughput(requests: pd.DataFrame) -> float:
    """Output tokens per second: every request's completion tokens over `run_seconds` (NaN for
    a run of no time). The one definition of "output tokens/s" and "throughput (tok/s)"."""
    seconds = run_seconds(requests)
    return float(requests.completion_tokens.sum() / seconds) if seconds > 0 else float("nan")


def run_figures(history) -> dict[str, float]:
    """A run's `FIGURES`: TTFT percentiles over requests, ITL's over every gap, the median
    TPOT and end-to-end latency over requests, and `output_throughput`."""
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
