"""How fast the twin simulates: steps per second of the host's wall time, with record="off".

    python benchmarks/twin_speed.py [--trace PATH] [--first N] [--max-seq-len N] [--repeat 3]
                                    [--only nano|trace]

On the twin of dummy Qwen3-0.6B, with step costs fitted on the H200 calibration runs that ship in
notebooks/data/twin/qwen3-0.6b (as notebooks/data/validate_twin_runs.py fits them), it runs:

- nano-vllm's workload (`bench`'s on a GPU): 256 requests, prompts and outputs uniform in
  [100, 1024], temperature 0.6, EOS ignored, all at once, a token budget of 16,384: one
  `LLM.generate` after a warm-up, `--repeat` times;
- a trace at its own rate: each request arriving at its second on the twin's clock and running
  its recorded output length, a longer one clipped to the engine's context (8,192 tokens unless
  `--max-seq-len` says more, as `bench --dataset-name` clips), once: the shipped Mooncake slice
  by default, `--trace path/to/conversation_trace.jsonl` for Mooncake's whole hour.

Prints each run's steps, simulated seconds, wall seconds (and the process's CPU seconds, the
same on an idle machine) and steps per wall second.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from workbench import LLM, SamplingParams, Workbench, fit_step_costs, load_run, traces
from workbench.bench.workload import random_workload
from workbench.twin import StepCosts

MODEL = "dummy:qwen3-0.6b"
RUNS = Path(__file__).resolve().parents[1] / "notebooks" / "data" / "twin" / "qwen3-0.6b"
SETTINGS = dict(max_extend_tokens=16384, max_running_reqs=256, record="off")


def shipped_costs() -> StepCosts:
    """Step costs fitted on the shipped calibration runs (`calib_*`)."""
    return fit_step_costs({p.stem: load_run(p) for p in sorted(RUNS.glob("calib_*.parquet"))})


def nano_vllm(costs: StepCosts, repeat: int) -> list[dict]:
    work = random_workload(256, (100, 1024), (100, 1024), seed=0)
    params = [
        SamplingParams(max_tokens=n, temperature=0.6, ignore_eos=True) for n in work.output_lens
    ]
    llm = LLM(MODEL, step_costs=costs, **SETTINGS)
    warm = random_workload(32, (100, 1024), (8, 16), seed=1)
    llm.generate(warm.prompts, SamplingParams(max_tokens=16, temperature=0.6))
    runs = []
    for _ in range(repeat):
        llm.scheduler.abort_all()  # step 0, an empty cache, the clock at 0
        start, cpu = time.perf_counter(), time.process_time()
        llm.generate(work.prompts, params)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        llm.check_integrity()
        steps, simulated = llm.scheduler.step_index, llm.scheduler.clock.now()
        runs.append(dict(steps=steps, simulated_s=simulated, wall_s=wall, cpu_s=cpu))
    llm.close()
    return runs


def trace_replay(costs: StepCosts, source: str, first: int | None, context: int | None) -> dict:
    wb = Workbench(MODEL, step_costs=costs, max_seq_len=context, **SETTINGS)
    scheduler = wb.scheduler
    start = time.perf_counter()
    max_len = min(wb.llm.engine.max_seq_len, scheduler.cache.total_size)
    trace = traces.load(source, first=first, max_len=max_len)
    wb.add_trace(trace, SamplingParams(temperature=0.6))
    queued = time.perf_counter() - start
    start, cpu = time.perf_counter(), time.process_time()
    wb.run_until(lambda record: False)  # (`run` would keep every step's record)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    wb.check_integrity()
    result = dict(
        summary=trace.summary(),
        steps=scheduler.step_index,
        simulated_s=scheduler.clock.now(),
        wall_s=wall,
        cpu_s=cpu,
        queue_s=queued,
    )
    wb.close()
    return result


def line(run: dict) -> str:
    return (
        f"{run['steps']:,} steps, {run['simulated_s']:,.1f} s simulated, {run['wall_s']:.3f} s "
        f"wall ({run['cpu_s']:.3f} s of CPU), {run['steps'] / run['wall_s']:,.0f} steps/s"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default="mooncake", help="a trace's file, or a shipped slice")
    parser.add_argument("--first", type=int, help="the trace's first N requests (default: all)")
    parser.add_argument("--max-seq-len", type=int, help="the context (default: the engine's)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of nano-vllm's workload")
    parser.add_argument("--only", choices=("nano", "trace"), help="one of the two workloads")
    args = parser.parse_args(argv)
    costs = shipped_costs()
    print(f"the twin of {MODEL} on {costs.meta['device_name']}, record off")
    if args.only != "trace":
        runs = nano_vllm(costs, args.repeat)
        for i, run in enumerate(runs):
            print(f"nano-vllm's workload, run {i + 1}: {line(run)}")
        median = statistics.median(r["wall_s"] for r in runs)
        print(f"  median: {median:.3f} s, {runs[0]['steps'] / median:,.0f} steps/s")
    if args.only != "nano":
        run = trace_replay(costs, args.trace, args.first, args.max_seq_len)
        s = run["summary"]
        print(
            f"trace {args.trace}: {s['requests']:,} requests over {s['duration_s']:,.0f} s "
            f"({s['rate']:.3g}/s), median prompt {s['prompt_len_median']:,.0f} tokens "
            f"({s['clipped']} clipped to {s['max_len']:,}), output {s['output_len_median']:,.0f}; "
            f"loaded and queued in {run['queue_s']:.1f} s"
        )
        print(f"  at its own rate: {line(run)}")


if __name__ == "__main__":
    main()
