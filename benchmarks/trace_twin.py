"""A window of a production trace on the real engine at the trace's own rate, and the twin's
prediction of the same window beside it.

    python benchmarks/trace_twin.py [--model M] [--trace mooncake|PATH] [--start S]
        [--duration D] [--first N] [--block-size B] [--time-scale X] [--chunks C1 C2 C3]
        [--policy P] [--repeats 2] [--save DIR]

On a GPU by default dummy Qwen3-0.6B, Mooncake's shipped slice (or `--trace` its whole
conversation trace), its first 100 requests with their recorded lengths (a longer one clipped to
the model's context) arriving at their recorded times; on the CPU tiny-qwen3 with 40 requests,
lengths scaled by 16/512. Each chunk size (`--chunks`, the token budget of a step) is one
setting, run `--repeats` times (record="light"), so the real figures carry their own noise.

Then, for each setting in turn, the twin is calibrated on the real runs of the others
(`fit_step_costs`) and predicts the held-out one on the same requests at the same times: its
figures beside the real ones as `validate_twin` gives them (error, the real runs' noise, the
share of the twin's steps outside its calibration). Each real run's prefix-cache hits are printed
beside the trace's ideal (`traces.prefix_reuse`), and the twin's beside them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from workbench import Workbench, fit_step_costs, traces, validate_twin
from workbench.twin import validation_summary

CUDA = torch.cuda.is_available()
FIGURES = [
    "throughput (tok/s)",
    "p50 TTFT (ms)",
    "p95 TTFT (ms)",
    "median ITL (ms)",
    "p95 ITL (ms)",
]


def load_window(args: argparse.Namespace, max_len: int) -> traces.Trace:
    return traces.load(
        args.trace,
        start=args.start,
        duration=args.duration,
        first=args.first,
        block_size=args.block_size,
        time_scale=args.time_scale,
        max_len=max_len,
        long="clip",
    )


def real_runs(wb: Workbench, trace: traces.Trace, settings: dict, repeats: int) -> dict:
    """Every repeat of every setting, named as `validate_twin` reads them ("name #N")."""
    done = wb.compare(settings, requests=trace, progress=False, repeats=repeats)
    runs = {}
    for name, first in done.items():
        for i, run in enumerate(first.repeats or (first,), 1):
            runs[f"{name} #{i}"] = run
    return runs


def held_out(model: str, trace, settings: dict, runs: dict, options: dict) -> tuple[dict, list]:
    """Each setting predicted by a twin calibrated on the other settings' real runs."""
    twins, tables = {}, []
    for name, setting in settings.items():
        calibration = {n: r for n, r in runs.items() if not n.startswith(f"{name} #")}
        costs = fit_step_costs(calibration)
        twin = Workbench(model, step_costs=costs, **options)
        run = twin.compare({name: setting}, requests=trace, progress=False)[name]
        twins[name] = run
        mine = {n: r for n, r in runs.items() if n.startswith(f"{name} #")}
        tables.append(validate_twin(mine, {name: run}, costs))
        twin.close()
    return twins, tables


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="dummy:qwen3-0.6b" if CUDA else "tiny-qwen3")
    parser.add_argument("--trace", default="mooncake", help="a shipped name or a file")
    parser.add_argument("--start", type=float, help="seconds into the trace")
    parser.add_argument("--duration", type=float, help="seconds of it")
    parser.add_argument("--first", type=int, default=100 if CUDA else 40, help="then N requests")
    parser.add_argument("--block-size", type=int, default=512 if CUDA else 16)
    parser.add_argument("--time-scale", type=float, default=1.0, help="2: half the rate")
    default_chunks = [512, 2048, 8192] if CUDA else [32, 64, 256]
    parser.add_argument("--chunks", type=int, nargs="+", default=default_chunks)
    parser.add_argument("--policy", default="prefill_first")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--save", type=Path, help="save every run there (parquet)")
    args = parser.parse_args(argv)

    options = {} if CUDA else {"page_size": 16}  # on the CPU: pages of one block
    wb = Workbench(args.model, record="light", **options)
    trace = load_window(args, wb.engine.max_seq_len)
    print(f"{args.model} on {'cuda' if CUDA else 'cpu'}: {trace}")
    summary = trace.summary()
    print(
        f"  median prompt {summary['prompt_len_median']:,.0f} tokens, output "
        f"{summary['output_len_median']:,.0f}; {trace.clipped_count} clipped to "
        f"{wb.engine.max_seq_len:,}; the ideal prefix reuse {trace.ideal.token_hit_rate:.1%} "
        f"of prompt tokens"
    )
    settings = {f"chunk {c}": dict(max_extend_tokens=c, policy=args.policy) for c in args.chunks}
    started = time.perf_counter()
    runs = real_runs(wb, trace, settings, args.repeats)
    print(f"real engine: {len(runs)} runs in {time.perf_counter() - started:.1f} s")
    wb.check_integrity()
    twin_options = {"overlap": wb.config.overlap, **options}
    wb.close()

    started = time.perf_counter()
    twins, tables = held_out(args.model, trace, settings, runs, twin_options)
    print(f"twin: {len(twins)} held-out settings in {time.perf_counter() - started:.1f} s")

    reuse = pd.DataFrame(
        {
            name: traces.prefix_reuse(run, trace).token_hit_rate
            for name, run in {**runs, **{f"{n} (twin)": t for n, t in twins.items()}}.items()
        }
    ).T
    reuse.columns = ["ideal", "run"]
    table = pd.concat(tables, ignore_index=True)
    shown = table[table.figure.isin(FIGURES)]
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print("\nprefix-cache hit rate in tokens, beside the trace's ideal:")
        print(reuse.round(4).to_string())
        print("\nthe twin on each held-out setting (calibrated on the others' real runs):")
        print(shown.round(2).to_string(index=False))
        print()
        print(validation_summary(table))
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        for name, run in {**runs, **{f"{n} twin": t for n, t in twins.items()}}.items():
            run.save(args.save / (name.replace(" ", "_").replace("#", "") + ".parquet"))


if __name__ == "__main__":
    main()
