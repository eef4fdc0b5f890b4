"""Record the real runs notebook 06 calibrates the twin on and checks it against.

    python notebooks/data/record_twin_runs.py dummy:qwen3-0.6b OUT_DIR [--requests 64]

On one GPU (the runs under notebooks/data/twin/ were recorded on an H200): one engine, overlap
on, record="light". First the workload with every request at time 0 (its duration gives the
capacity, in requests/s); then three calibration settings on a workload that sweeps the load
(`ramp_requests`: 96 other requests, half arriving at 30% of capacity, then the rest at 100%),
and the twelve held-out settings (chunk 64, 512, 2048, 8192 x the three policies) at 50% and
90%, each run twice (the real runs' own noise). The held-out runs serve the same requests every
time (`twin_requests`), arriving by a Poisson process of the rate. Each run is saved as
OUT_DIR/<name>.parquet.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from workbench import SamplingParams, Workbench
from workbench.bench.online import poisson_arrivals
from workbench.bench.workload import random_workload
from workbench.runs import RunHistory

# NOTE: chosen among 21 recorded calibration runs of 0.6B (notebooks/data/twin/candidates/,
# docs/performance.md, "Which runs calibrate"): small prompt chunks beside many decoding
# requests; a lone prompt of every size, then full decode batches; prompts of several requests at
# once and long decode-only stretches
CALIBRATION = {
    "calib chunk 64 mixed": dict(max_extend_tokens=64, policy="mixed"),
    "calib chunk 2048 prefill_first": dict(max_extend_tokens=2048, policy="prefill_first"),
    "calib chunk 4096 decode_first": dict(max_extend_tokens=4096, policy="decode_first"),
}
CALIBRATION_REQUESTS = 96
CHUNKS = (64, 512, 2048, 8192)
POLICIES = ("prefill_first", "decode_first", "mixed")
HELD_OUT = {f"chunk {c} {p}": dict(max_extend_tokens=c, policy=p) for c in CHUNKS for p in POLICIES}


def twin_requests(num_requests: int, rate: float, seed: int = 0) -> list[tuple]:
    """The workload: prompts of 100-1,024 random tokens, 32-256 output tokens (EOS ignored),
    arriving at `rate` requests/s (inf: all at time 0); (ids, sampling, arrival seconds)."""
    return _arriving(num_requests, seed, poisson_arrivals(num_requests, rate, seed))


def ramp_requests(num_requests: int, capacity: float, seed: int = 1) -> list[tuple]:
    """A calibration workload that sweeps the load: requests drawn as `twin_requests` draws
    them (another seed: none is a held-out request), the first half arriving at 30% of
    `capacity` (requests/s) and the second at 100%. One run then holds lone prompts of every
    size on an idle engine and, later, full batches with a queue behind them."""
    half = num_requests // 2
    calm = poisson_arrivals(half, 0.3 * capacity, seed)
    busy = poisson_arrivals(num_requests - half, capacity, seed + 1)
    return _arriving(num_requests, seed, calm + [calm[-1] + t for t in busy])


def _arriving(num_requests: int, seed: int, times: list[float]) -> list[tuple]:
    """The workload's requests (drawn with `seed`), arriving at `times`."""
    work = random_workload(num_requests, (100, 1024), (32, 256), seed)
    return [
        (ids, SamplingParams(max_tokens=n, ignore_eos=True), at)
        for ids, n, at in zip(work.prompts, work.output_lens, times)
    ]


def save(run: RunHistory, path: Path) -> None:
    """The run, kept small: without its texts (random token ids decode to long, meaningless
    strings), its admissions table (a deep queue is thousands of refusals a step), and with each
    sampled token (random, from dummy weights) written as 0; times to 0.1 us."""
    meta = {k: v for k, v in run.meta.items() if k != "texts"}
    tables = dict(run.tables())
    ledger = tables["ledger"]
    tables["ledger"] = ledger.assign(token=ledger.token.where(ledger.token.isna(), 0))
    tables["admissions"] = tables["admissions"].iloc[:0]
    ms = [c for c in tables["steps"].columns if c.endswith("_ms")]
    tables["steps"] = tables["steps"].round({c: 4 for c in ms})
    RunHistory(tables, meta).save(path)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each held-out setting")
    parser.add_argument("--budget-s", type=float, default=1e9, help="start no run after this")
    parser.add_argument(
        "--capacity", type=float, help="requests/s of an earlier recording (no offline run)"
    )
    parser.add_argument(
        "--only", metavar="TEXT", help="record only the held-out runs whose name holds TEXT"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    begun = time.perf_counter()
    wb = Workbench(args.model, record="light", overlap=True)
    n = args.requests
    wb.compare({"warm-up": {}}, twin_requests(32, float("inf"), 1), progress=False, arrival="time")
    capacity = args.capacity
    if capacity is None:
        every = twin_requests(n, float("inf"))
        offline = wb.compare({"offline": {}}, every, progress=False, arrival="time")["offline"]
        capacity = n / float(offline.requests.finish_s.max())
        save(offline, args.out / "offline.parquet")
    # the held-out settings' first runs before any repeat: a budget cut leaves whole sweeps
    plan = [] if args.only else [(CALIBRATION, "ramp", 1)]
    plan += [(HELD_OUT, load, r) for r in range(1, args.repeats + 1) for load in (0.5, 0.9)]
    index = {"model": args.model, "requests": n, "capacity_rps": capacity, "runs": {}}
    for settings, load, repeat in plan:
        if load == "ramp":
            requests, count, at = (
                ramp_requests(CALIBRATION_REQUESTS, capacity),
                CALIBRATION_REQUESTS,
                "ramp 30-100%",
            )
        else:
            requests, count, at = twin_requests(n, load * capacity), n, f"load {load:.0%}"
        started = time.perf_counter()
        for name, options in settings.items():
            if time.perf_counter() - begun > args.budget_s:
                break
            name = f"{name} {at} #{repeat}"
            if args.only and args.only not in name:
                continue
            run = wb.compare({name: options}, requests, progress=False, arrival="time")[name]
            path = args.out / (
                name.replace(" ", "_").replace("%", "pct").replace("#", "") + ".parquet"
            )
            save(run, path)
            index["runs"][name] = {"file": path.name, "load": load, "requests": count, **options}
        print(
            f"{settings is CALIBRATION and 'calibration' or 'held out'} at {at} "
            f"#{repeat}: {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        (args.out / "index.json").write_text(json.dumps(index, indent=1))
    wb.check_integrity()
    (args.out / "index.json").write_text(json.dumps(index, indent=1))
    print(f"capacity {capacity:.2f} requests/s; {len(index['runs'])} runs in {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
