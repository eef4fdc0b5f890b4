"""Chrome trace export: the run's steps and profiler events as JSON that Perfetto opens."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .rank_clock import CLOCK_ALIGNMENT
from .rank_skew import residual_us

SKEW_COLUMNS = ("rank_skew_ms", "latest_rank")  # a step's, in its args when the table has them


def chrome_trace(steps: pd.DataFrame, events: pd.DataFrame, meta: dict | None = None) -> dict:
    """One process per rank, rank 0's first track the scheduler steps; `otherData` holds `meta`."""
    trace = [
        _step_event(row, args) for row, args in zip(steps.itertuples(index=False), _args(steps))
    ]
    ranks = events["rank"] if "rank" in events else pd.Series(0, index=events.index)
    tracks: dict[tuple[int, str], int] = {(0, "scheduler steps"): 0}
    for row, rank in zip(events.itertuples(index=False), ranks.tolist()):
        tid = tracks.setdefault((rank, row.track), len(tracks))
        trace.append(
            {
                "name": row.name,
                "cat": row.category,
                "ph": "X",
                "ts": float(row.start_us),
                "dur": float(row.duration_us),
                "pid": rank,
                "tid": tid,
                "args": {"step": int(row.step)},
            }
        )
    for rank in sorted({rank for rank, _ in tracks}):
        name = {"name": f"rank {rank}"}
        trace.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": name})
    for (rank, name), tid in tracks.items():
        trace.append(
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}}
        )
    other = {k: v for k, v in (meta or {}).items() if k not in ("texts", "step_costs")}
    if ranks.gt(0).any():
        other["clock_alignment"] = CLOCK_ALIGNMENT
        other["all_reduce_end_gap_us"] = residual_us(events)  # the largest left after it
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": other}


def _args(steps: pd.DataFrame) -> list[dict]:
    """Each step's own args beyond the fixed ones: `profiled`, and its skew where it has one."""
    profiled = steps["profiled"] if "profiled" in steps else pd.Series(False, index=steps.index)
    out = [{"profiled": bool(p)} for p in profiled]
    for column in SKEW_COLUMNS:
        if column in steps:
            for args, value in zip(out, steps[column].tolist()):
                if not pd.isna(value):
                    args[column] = value
    return out


def _step_event(row, args: dict) -> dict:
    return {
        "name": f"step {row.step} {row.phase}",
        "cat": row.phase,
        "ph": "X",
        "ts": row.launched_at * 1e6,
        "dur": max(row.wall_ms * 1e3, 1.0),
        "pid": 0,
        "tid": 0,
        "args": {
            "batch_size": int(row.batch_size),
            "num_tokens": int(row.num_tokens),
            "queue_len": int(row.queue_len),
            "kv_free": int(row.kv_free),
            "device_ms": float(row.device_ms),
            **args,
        },
    }


def export_trace(
    steps: pd.DataFrame, events: pd.DataFrame, path: str | Path, meta: dict | None = None
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(steps, events, meta), default=str))
    return path
