"""Chrome trace export: the run's steps and profiler events as JSON that Perfetto opens."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def chrome_trace(steps: pd.DataFrame, events: pd.DataFrame, meta: dict | None = None) -> dict:
    """One track of scheduler steps (launched to completed), then one per profiler thread/stream.
    Each step says whether the profiler recorded it (`profiled`); the trace's `otherData`
    holds `meta` (the run's settings: "profile_steps" says what chose the profiled steps)."""
    tracks: dict[str, int] = {"scheduler steps": 0}
    trace = []
    profiled = steps["profiled"] if "profiled" in steps else pd.Series(False, index=steps.index)
    for row, was_profiled in zip(steps.itertuples(index=False), profiled):
        trace.append(
            {
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
                    "profiled": bool(was_profiled),
                },
            }
        )
    for row in events.itertuples(index=False):
        tid = tracks.setdefault(row.track, len(tracks))
        trace.append(
            {
                "name": row.name,
                "cat": row.category,
                "ph": "X",
                "ts": float(row.start_us),
                "dur": float(row.duration_us),
                "pid": 0,
                "tid": tid,
                "args": {"step": int(row.step)},
            }
        )
    for name, tid in tracks.items():
        trace.append(
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}}
        )
    other = {k: v for k, v in (meta or {}).items() if k not in ("texts", "step_costs")}
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": other}


def export_trace(
    steps: pd.DataFrame, events: pd.DataFrame, path: str | Path, meta: dict | None = None
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(steps, events, meta), default=str))
    return path
