"""Run files: the size of a saved run in Parquet and in JSON, and the time to save, load and
report it.

    python benchmarks/run_files.py RUN [RUN ...]
    python benchmarks/run_files.py --build 2000 [--record light] [--model tiny-llama]

Each run (a saved run in either format; with `--build N`, also N steps of a fresh run of
`--model`) is saved in both formats to a temporary folder and loaded back from each. Printed per
run: its steps, events and rows per table; per format the file's size, the save time and the load
time (open, then every table); the time `report()` takes from the run loaded from Parquet; and
whether each format gave back the run's tables exactly.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from workbench.runs import load_run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="*", type=Path, metavar="RUN", help="saved runs")
    parser.add_argument("--build", type=int, metavar="STEPS", help="also build a run this long")
    parser.add_argument("--record", default="light", choices=["light", "full"])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--no-report", action="store_true", help="skip timing report()")
    args = parser.parse_args(argv)
    if not args.runs and not args.build:
        parser.error("give saved runs, or --build STEPS")
    with tempfile.TemporaryDirectory(prefix="run-files-") as tmp:
        runs = list(args.runs)
        if args.build:
            runs.append(build_run(args.model, args.build, args.record, Path(tmp) / "built.parquet"))
        for i, path in enumerate(runs):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            compare(path, folder, report=not args.no_report)


def build_run(model: str, steps: int, record: str, path: Path) -> Path:
    """`steps` steps of a steady stream of requests (a new one every 4 steps, 48 tokens each)."""
    from workbench.core import SamplingParams
    from workbench.workbench import Workbench

    wb = Workbench(model, record=record, max_running_reqs=16)
    sampling = SamplingParams(max_tokens=48, ignore_eos=True)
    for i in range(steps // 4 + 1):
        wb.add_request(f"Request {i}: tell me about the number {i * 7919}.", sampling, 4 * i)
    start = time.perf_counter()
    wb.step(steps)
    print(f"built {len(wb.history)} steps of {model} (record={record}) in {_s(start)}")
    return wb.save(path)


def compare(path: Path, folder: Path, report: bool = True) -> None:
    start = time.perf_counter()
    source = load_run(path)
    tables = dict(source.tables())
    with open(path, "rb") as f:
        kind = "parquet" if f.read(4) == b"PAR1" else "json"
    print(f"\n{path} ({kind}, {path.stat().st_size / 1e6:.2f} MB, loaded in {_s(start)})")
    print(f"  {len(tables['steps'])} steps, {len(tables['events']):,} events")
    print("  rows: " + ", ".join(f"{name} {len(frame):,}" for name, frame in tables.items()))
    print(f"  {'format':<8} {'size':>10} {'save':>8} {'open':>8} {'tables':>8} {'load':>8}  exact")
    for fmt in ("parquet", "json"):
        start = time.perf_counter()
        out = source.save(folder / f"run.{fmt}")
        save_s = time.perf_counter() - start
        start = time.perf_counter()
        run = load_run(out)
        open_s = time.perf_counter() - start
        frames = {name: run.tables()[name] for name in run.tables()}
        load_s = time.perf_counter() - start
        exact = _equal(tables, frames) and run.meta == source.meta
        size = f"{out.stat().st_size / 1e6:.2f} MB"
        print(
            f"  {fmt:<8} {size:>10} {save_s:7.2f}s {open_s:7.2f}s {load_s - open_s:7.2f}s "
            f"{load_s:7.2f}s  {'yes' if exact else 'NO'}"
        )
    if report:
        run = load_run(folder / "run.parquet")  # a fresh open: the report reads its tables
        start = time.perf_counter()
        run.report(folder / "report.html")
        print(f"  report() from the Parquet run: {_s(start)}")


def _equal(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> bool:
    if list(a) != list(b):
        return False
    try:
        for name in a:
            pd.testing.assert_frame_equal(a[name], b[name], check_exact=True)
    except AssertionError as e:
        print(f"  ({name}: {str(e).splitlines()[0]})")
        return False
    return True


def _s(start: float) -> str:
    return f"{time.perf_counter() - start:.2f}s"


if __name__ == "__main__":
    main()
