"""Chrome trace export: the run's steps and profiler events as JSON that Perfetto opens."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def chrome_trace(steps: pd.DataFrame, events: pd.DataFrame) -> dict:
    """One track of scheduler steps (launched to completed), then one per profiler thread/stream."""
    tracks: dict[str, int] = {"scheduler steps": 0}
    trace = []
    for row in steps.itertuples(index=False):
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
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def export_trace(steps: pd.DataFrame, events: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(steps, events)))
    return path
