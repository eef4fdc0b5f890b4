"""A run's prefix-cache hits beside its trace's ideal (`prefix_reuse`), in tokens and blocks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .ideal import Reuse, ideal_reuse, run_reuse
from .trace import Trace

if TYPE_CHECKING:
    import pandas as pd


def prefix_reuse(run, trace: Trace) -> pd.DataFrame:
    """The prefix cache's hits of a run of `trace` (`wb.history`, a `RunHistory` from `compare`
    or `load_run`), in tokens and in blocks, beside the trace's ideal. The run's come from its
    requests table: each request's cached tokens when it was admitted (requests never admitted
    are left out, from the ideal too)."""
    ideal, ran = reuse_of(run, trace)
    rows = {"ideal (unbounded cache, in trace order)": ideal, "run": ran}
    return reuse_table(rows, trace.block_size)


def reuse_of(run, trace: Trace) -> tuple[Reuse, Reuse]:
    """(the ideal, the run's) reuse of the requests of a run of `trace` that were admitted."""
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a Trace (traces.load), got {type(trace).__name__}")
    history = getattr(run, "history", run)  # a Workbench or an LLM: its run so far
    if not hasattr(history, "requests"):
        raise TypeError(
            "run must be a run of the trace (wb.history, a compare or load_run run, or a "
            f"Workbench), got {type(run).__name__} {run!r:.60}"
        )
    requests = history.requests
    if not len(requests):
        raise ValueError(
            "the run has no requests in its history: replay the trace with record='light' (or "
            "'full'), run it, then ask"
        )
    if len(requests) > len(trace.requests):
        raise ValueError(
            f"the run has {len(requests)} requests, the trace {len(trace.requests)}: is it a "
            "run of this trace (Workbench.add_trace, compare(requests=trace))?"
        )
    prompt_lens = requests["prompt_tokens"].tolist()
    for k, (prompt_len, r) in enumerate(zip(prompt_lens, trace.requests)):
        if prompt_len != r.prompt_len:
            raise ValueError(
                f"the run's request {k} has {prompt_len} prompt tokens, the trace's "
                f"{r.prompt_len}: is it a run of this trace, in trace order?"
            )
    admitted = requests["first_scheduled_step"].notna().to_numpy()
    ran = [r for r, a in zip(trace.requests, admitted) if a]
    return ideal_reuse(ran, trace.block_size), run_reuse(
        requests["prompt_tokens"][admitted], requests["cached_tokens"][admitted], trace.block_size
    )


def reuse_table(rows: dict[str, Reuse], block_size: int) -> pd.DataFrame:
    import pandas as pd

    frame = pd.DataFrame(
        [
            {**r._asdict(), "token_hit_rate": r.token_hit_rate, "block_hit_rate": r.block_hit_rate}
            for r in rows.values()
        ],
        index=pd.Index(list(rows), name=f"prefix cache (blocks of {block_size} tokens)"),
    )
    return frame[
        ["requests", "prompt_tokens", "hit_tokens", "token_hit_rate"]
        + ["prompt_blocks", "hit_blocks", "block_hit_rate"]
    ]
