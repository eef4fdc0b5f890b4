"""The twin against a directory of recorded runs (`record_twin_runs.py`): the closing figures.

    python notebooks/data/validate_twin_runs.py DIR [--candidates MORE --calibration NAME ...]

Fits step costs on the calibration runs, simulates every held-out setting at each load with the
same requests the GPU served, and prints `validation_summary` (median and worst |error| per
figure, the real runs' median noise) and, per figure, policy and load, whether the twin picks
the real runs' best chunk size. `--calibration` fits on the named runs instead (of DIR's
calibration runs and of `--candidates` MORE, a directory of more of them recorded the same way:
`notebooks/data/twin/candidates/<model>`), e.g. `--calibration "calib chunk 128 mixed load 70%
#1" ...`, to compare choices of calibration on the same held-out runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import pandas as pd

from workbench import Workbench, fit_step_costs, load_run, validate_twin
from workbench.twin import validation_summary

sys.path.insert(0, str(Path(__file__).parent))
from record_twin_runs import HELD_OUT, twin_requests  # noqa: E402


def main(directory: Path, candidates: Path | None = None, calibration: list[str] = ()) -> None:
    index = json.loads((directory / "index.json").read_text())
    runs = {name: load_run(directory / r["file"]) for name, r in index["runs"].items()}
    real = {n: r for n, r in runs.items() if not n.startswith("calib")}
    if not real:
        raise SystemExit(
            f"{directory} has calibration runs only ({len(runs)}): nothing to validate against; "
            "record_twin_runs.py's --budget-s ended before the first held-out run"
        )
    chosen = {n: r for n, r in runs.items() if n.startswith("calib")}
    if calibration:  # among DIR's calibration runs and the candidates
        pool = dict(chosen)
        if candidates is not None:
            more = json.loads((candidates / "index.json").read_text())
            pool |= {n: load_run(candidates / r["file"]) for n, r in more["runs"].items()}
        missing = sorted(set(calibration) - set(pool))
        if missing:
            raise SystemExit(f"no calibration run {missing}; there are {sorted(pool)}")
        chosen = {n: pool[n] for n in calibration}
    costs = fit_step_costs(chosen)
    print(costs)
    recorded = {re.sub(r"\s*#\d+$", "", n) for n in real}
    twin = Workbench(index["model"], step_costs=costs, overlap=True)
    twins, started = {}, time.perf_counter()
    for load in sorted({index["runs"][name]["load"] for name in real}):
        settings = {f"{name} load {load:.0%}": s for name, s in HELD_OUT.items()}
        settings = {name: s for name, s in settings.items() if name in recorded}
        requests = twin_requests(index["requests"], load * index["capacity_rps"])
        twins |= twin.compare(settings, requests, progress=False, arrival="time")
    print(f"{len(twins)} settings simulated in {time.perf_counter() - started:.1f} s")
    table = validate_twin(real, twins)
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(validation_summary(table))
        print(best_chunks(table))


def best_chunks(table: pd.DataFrame) -> pd.DataFrame:
    """Per figure, policy and load: the chunk size with the lowest real and predicted value,
    and what the twin's pick costs: its real value over the real best (%), beside the real
    runs' noise at the two (the larger spread of two runs of one setting, %). A pick whose
    cost is within that noise is as good as the best, as far as the GPU itself can tell."""
    t = table[table.figure.isin(["p95 TTFT (ms)", "median ITL (ms)", "E2E (ms)"])].copy()
    parts = t.setting.str.extract(r"chunk (\d+) (\w+) load (\d+%)")
    t["chunk"], t["policy"], t["load"] = parts[0].astype(int), parts[1], parts[2]
    rows = []
    for (figure, policy, load), g in t.groupby(["figure", "policy", "load"]):
        real, twin = g.loc[g.real.idxmin()], g.loc[g.predicted.idxmin()]
        cost = (twin.real - real.real) / real.real * 100
        noise = max(real.noise_pct, twin.noise_pct)
        rows.append((figure, policy, load, real.chunk, twin.chunk, round(cost, 2), round(noise, 2)))
    columns = ["figure", "policy", "load", "real best", "twin best", "pick cost %", "noise %"]
    out = pd.DataFrame(rows, columns=columns)
    out["same"] = out["pick cost %"] <= 0  # (a tie with the real best is the best too)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--candidates", type=Path, help="a directory of more calibration runs")
    parser.add_argument("--calibration", nargs="+", default=(), help="the runs to fit on")
    args = parser.parse_args()
    main(args.directory, args.candidates, args.calibration)
