"""Cut recorded runs (`record_twin_runs.py`) down to what notebook 06 reads, for the repo.

    python notebooks/data/slim_twin_runs.py RECORDED_DIR notebooks/data/twin/<model> ["load 90%"]

The calibration runs are kept whole but for an MoE model's routing table (tokens per expert per
layer per step: 4.6 million rows, 15 times the rest of a run; the fit reads the steps table's
experts touched). A held-out run keeps its requests table, its steps table's composition and
timings (times to 1 us), an MoE model's experts touched per step (a feature of its step costs;
the routing table is dropped) and, of its ledger, which request got a token at which step (what
ITL is read from): the validation's figures and the per-step device error need no more. With a
filter (e.g. "load 90%"), only the held-out runs whose name holds it are kept.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from workbench import load_run
from workbench.runs import RunHistory

STEP_COLUMNS = [
    "step", "phase", "batch_size", "padded_size", "num_tokens", "prefill_tokens",
    "chunk_tokens", "decode_tokens", "padding_tokens", "sampled", "decode_context",
    "prefill_pairs", "admitted", "queue_len", "running", "cuda_graph", "overlapped",
    "launched_at", "completed_at", "wall_ms", "device_ms", "host_ms", "wait_ms",
    "host_schedule_ms", "host_prepare_ms", "host_plan_ms", "host_forward_ms",
    "host_sample_ms", "host_share_ms", "host_collect_ms", "host_record_ms", "simulated",
    "experts_touched", "expert_imbalance",  # an MoE model's (missing from older recordings)
]  # fmt: skip


def slim(run: RunHistory) -> RunHistory:
    tables = dict(run.tables())
    steps = tables["steps"]
    steps = steps[[c for c in STEP_COLUMNS if c in steps]]
    ms = [c for c in steps.columns if c.endswith("_ms")]
    tables["steps"] = steps.round({**{c: 3 for c in ms}, "launched_at": 6, "completed_at": 6})
    ledger = tables["ledger"]
    tables["ledger"] = ledger.loc[ledger.token.notna(), ["step", "uid", "token"]]
    for name in ("admissions", "events", "pages", "routing"):
        if name in tables:
            tables[name] = tables[name].iloc[:0]
    return RunHistory(tables, {**run.meta, "slim": True})


def main(source: Path, target: Path, keep: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    index = json.loads((source / "index.json").read_text())
    kept = {}
    for name, entry in index["runs"].items():
        if name.startswith("calib"):
            run = load_run(source / entry["file"])
            if len(run.tables().get("routing", ())):
                tables = dict(run.tables())
                tables["routing"] = tables["routing"].iloc[:0]
                RunHistory(tables, run.meta).save(target / entry["file"])
            else:
                shutil.copy(source / entry["file"], target / entry["file"])
        elif not keep or any(k in name for k in keep):
            slim(load_run(source / entry["file"])).save(target / entry["file"])
        else:
            continue
        kept[name] = entry
    (target / "index.json").write_text(json.dumps({**index, "runs": kept}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
