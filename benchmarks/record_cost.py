"""What recording costs: record="off", "light" and "full" on the same work, in one process.

    python benchmarks/record_cost.py [--model smollm2] [--requests 8] [--tokens 32]
    python benchmarks/record_cost.py --workload arriving [--model dummy:qwen3-0.6b]

The default ("steps") runs the levels in turn, `--repeat` rounds (naive cache, so every round does
the same work), and prints the median step time of each and its overhead against "off".

`--workload arriving` is notebook 04's on a GPU: 24 requests of 200 to 1,500 tokens, 32 to 64
output tokens, one arriving every 2 steps, chunk 256, policy mixed, overlap on; one `Workbench`
runs it with "light" and "full" in turn (`--repeat` rounds). For each level: the whole run (the
steps, then reading the tables a user looks at: steps and, with "full", the profiler's events),
and per phase the median step time and the median of each step's ratio to the same step of the
"light" run (arrivals by step: the two runs schedule the same batches), and with "full" the host
time the profiler added per step by its own estimate (the steps table's `profiler_ms`) against
the measured difference (full's step over the same step recorded light, minus one light step);
what full's run spent stopping its profiler session and reading its events (both inside the
run; reading split into kineto's list of them, our pass that keeps some, and giving those to
their steps), and on a GPU what the first CUDA call after each run took (CUPTI's teardown
waits for one).
`--when EXPR` adds a third recording, "window": record="full" profiling only the steps EXPR
holds for (`profile_steps`), its chosen and its other steps each against light.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time

import numpy as np
import torch
from vs_hf import PROMPTS

from workbench.clocks import HOST_STAGES
from workbench.config import RECORD_LEVELS
from workbench.core import SamplingParams
from workbench.instrument.profiler import SessionEvents
from workbench.llm import LLM
from workbench.profiling import session_seconds

LEVELS = RECORD_LEVELS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=("steps", "arriving"), default="steps")
    parser.add_argument("--model", default=None, help="smollm2, or dummy:qwen3-0.6b (arriving)")
    parser.add_argument("--requests", type=int, default=None, help="8 (steps), 24 (arriving)")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=None, help="5 (steps), 3 (arriving)")
    parser.add_argument(
        "--when", metavar="EXPR", help="arriving: also a window profiling the steps EXPR holds for"
    )
    args = parser.parse_args(argv)
    if args.workload == "arriving":
        model = args.model or "dummy:qwen3-0.6b"
        arriving(model, args.requests or 24, args.repeat or 3, args.when)
    else:
        steps(args.model or "smollm2", args.requests or 8, args.tokens, args.repeat or 5)


def steps(model: str, requests: int, tokens: int, repeat: int) -> None:
    prompts = (PROMPTS * (requests // len(PROMPTS) + 1))[:requests]
    sp = SamplingParams(max_tokens=tokens, ignore_eos=True)
    llms = {level: LLM(model, cache="naive", record=level) for level in LEVELS}
    for llm in llms.values():
        llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    per_step: dict[str, list[float]] = {level: [] for level in LEVELS}
    for _ in range(repeat):
        for level, llm in llms.items():
            records = []
            start = time.perf_counter()
            llm.generate(prompts, sp, on_step=records.append)
            per_step[level].append((time.perf_counter() - start) / len(records) * 1e3)
            llm.history.records.clear()
    base = statistics.median(per_step["off"])
    device = llms["off"].engine.device
    print(f"{model} on {device}, {requests} requests x {tokens} tokens, median of {repeat} rounds")
    for level in LEVELS:
        ms = statistics.median(per_step[level])
        print(f"record={level:<5}  {ms:8.2f} ms/step  overhead {100 * (ms / base - 1):+6.1f}%")


def arriving_requests(count: int, seed: int = 0) -> list[tuple]:
    """Notebook 04's GPU workload: prompts of 200 to 1,500 tokens, 32 to 64 output tokens,
    one request arriving every 2 steps."""
    rng = random.Random(seed)
    return [
        (
            [rng.randrange(1000, 20000) for _ in range(rng.randint(200, 1500))],
            SamplingParams(max_tokens=rng.randint(32, 64), ignore_eos=True),
            2 * i,
        )
        for i in range(count)
    ]


def arriving(model: str, count: int, repeat: int, when: str | None = None) -> None:
    from workbench.workbench import Workbench

    requests = arriving_requests(count)
    wb = Workbench(model, overlap=True, max_running_reqs=32, max_extend_tokens=256, policy="mixed")
    totals: dict[str, list[tuple[float, float]]] = {"light": [], "full": []}
    if when is not None:
        totals["window"] = []
    # (reconfigure keeps what it is not told: each level says its window)
    options = {"light": {}, "full": {"profile_steps": None}, "window": {"profile_steps": when}}
    sessions: dict[str, dict[str, float]] = {}  # of the last round: profiler start/stop seconds
    tables = {}
    afterwards: dict[str, list[float]] = {level: [] for level in totals}
    # a session's events read and given to their steps
    with timed(SessionEvents, "fill") as reading:
        for round_ in range(repeat + 1):  # round 0 warms up (kernels, graphs)
            for level in totals:
                wb.reset()
                wb.reconfigure(record="full" if level == "window" else level, **options[level])
                for prompt, sampling, step in requests:
                    wb.add_request(prompt, sampling, arrival_step=step)
                profiler, read_before = session_seconds(), reading["s"]
                start = time.perf_counter()
                wb.run(progress=False)
                ran = time.perf_counter()
                if wb.engine.device.type == "cuda":  # (CUPTI's teardown waits for a runtime call)
                    torch.cuda.synchronize()
                    synced = time.perf_counter()
                    if round_:
                        afterwards[level].append(synced - ran)
                    ran = synced
                run = wb.snapshot()
                table = run.steps
                if level != "light":
                    len(run.events)
                if round_:
                    totals[level].append((ran - start, time.perf_counter() - ran))
                    after = session_seconds()
                    sessions[level] = {k: after[k] - profiler[k] for k in after}
                    sessions[level]["fill"] = reading["s"] - read_before
                    if level != "light":
                        sessions[level]["events"] = run.events.category.value_counts().to_dict()
                    tables.setdefault(level, []).append(table)
    wb.check_integrity()
    light_s = statistics.median(run + read for run, read in totals["light"])
    print(
        f"{model} on {wb.engine.device}: {count} requests arriving every 2 steps, chunk 256, "
        f"mixed, overlap on; medians of {repeat} rounds"
        + (" (under 3: a median is then a mean, and one odd round moves it)" if repeat < 3 else "")
    )
    for level, times in totals.items():
        run_s = statistics.median(t[0] for t in times)
        read_s = statistics.median(t[1] for t in times)
        print(
            f"record={level:<5} whole run {run_s + read_s:6.2f} s (steps {run_s:.2f} + tables "
            f"{read_s:.2f}) = {(run_s + read_s) / light_s:.2f}x light"
        )
    for phase in ("prefill", "mixed", "decode"):
        line = [f"{phase:>7} steps:"]
        for level in totals:
            wall = [t.wall_ms[t.phase == phase].median() for t in tables[level]]
            line.append(f"{level} {statistics.median(wall):6.2f} ms")
        ratios = [
            np.median(f.wall_ms[f.phase == phase].to_numpy() / lt.wall_ms[lt.phase == phase])
            for f, lt in zip(tables["full"], tables["light"])
            if len(f) == len(lt)
        ]
        if ratios:
            line.append(f"full / light per step {statistics.median(ratios):.2f}x")
        added = [t.profiler_ms[t.phase == phase].median() for t in tables["full"]]
        line.append(f"profiler's own estimate {statistics.median(added):.2f} ms/step")
        measured = [
            np.median(f.wall_ms[f.phase == phase].to_numpy() - lt.wall_ms[lt.phase == phase])
            for f, lt in zip(tables["full"], tables["light"])
            if len(f) == len(lt)
        ]
        if measured:
            line.append(f"measured {statistics.median(measured):.2f} ms/step")
        print("  ".join(line))
    if "window" in tables:
        window_cost(tables, when)
    where_time_went(tables, totals)
    for level in ("full", "window"):
        if level in sessions:  # a window's steps may make several sessions, each stopped
            n, started, stopped, read, listed, passed = (
                sessions[level][k] for k in ("sessions", "start", "stop", "fill", "list", "read")
            )
            kept = sessions[level]["events"].items()
            events = ", ".join(f"{count} {kind}" for kind, count in kept)
            print(
                f"{level}'s profiler sessions (last round): {n:.0f}, starting {started:.3f} s, "
                f"stopping {stopped:.3f} s, reading {read:.3f} s (both inside the run; kineto's "
                f"list {listed:.3f} s, our pass {passed:.3f} s, to steps "
                f"{read - listed - passed:.3f} s; events kept: {events or 'none'})"
            )
    for level, seconds in afterwards.items():
        if seconds:
            print(
                f"{level}: the first CUDA call after the run (a synchronize) took "
                f"{1e3 * statistics.median(seconds):.1f} ms (median; max "
                f"{1e3 * max(seconds):.1f}), outside the whole run's time"
            )


def window_cost(tables: dict[str, list], when: str) -> None:
    """The window's steps against the same steps recorded light: those it profiled, and the
    others (which should cost what light costs)."""
    chosen, others, counts = [], [], []
    for w, lt in zip(tables["window"], tables["light"]):
        if len(w) != len(lt):
            continue
        ratio = w.wall_ms.to_numpy() / lt.wall_ms.to_numpy()
        profiled = w.profiled.to_numpy(dtype=bool)
        counts.append(int(profiled.sum()))
        if profiled.any():
            chosen.append(float(np.median(ratio[profiled])))
        others.append(float(np.median(ratio[~profiled])))
    if not others:
        print(f"window ({when}): its runs scheduled other steps than light's; no comparison")
        return
    line = f"window ({when}): profiled {statistics.median(counts):.0f} steps a run"
    if chosen:
        line += f", those {statistics.median(chosen):.2f}x light per step"
    print(f"{line}; the others {statistics.median(others):.2f}x light per step")


@contextlib.contextmanager
def timed(cls: type, name: str):
    """Meanwhile `cls.name` adds the seconds it takes to the yielded dict's "s"."""
    method, spent = getattr(cls, name), {"s": 0.0}

    def wrapper(self, *args, **kwargs):
        began = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            spent["s"] += time.perf_counter() - began

    setattr(cls, name, wrapper)
    try:
        yield spent
    finally:
        setattr(cls, name, method)


def where_time_went(tables: dict[str, list], totals: dict[str, list]) -> None:
    """Of the last round: each level's time in steps by phase (their walls overlap with
    overlap on), outside the steps, per host stage, and full's slowest steps beside the same
    steps recorded light."""
    for level, frames in tables.items():
        t, (run_s, _) = frames[-1], totals[level][-1]
        by_phase = t.groupby("phase").wall_ms.agg(["count", "sum"])
        phases = ", ".join(
            f"{p} {int(r['count'])} steps {r['sum']:.0f} ms" for p, r in by_phase.iterrows()
        )
        stages = ", ".join(f"{s} {t[f'host_{s}_ms'].sum():.0f}" for s in HOST_STAGES)
        span_ms = (t.completed_at.max() - t.launched_at.min()) * 1e3  # steps overlap (overlap)
        print(
            f"{level}: {phases}; first launch to last collect {span_ms:.0f} ms, outside it "
            f"{run_s * 1e3 - span_ms:.0f} ms; "
            f"host ms by stage: {stages}; wait {t.wait_ms.sum():.0f}; "
            f"device {t.device_ms.sum():.0f}"
        )
    full, light = tables["full"][-1], tables["light"][-1].set_index("step")
    for _, row in full.nlargest(5, "wall_ms").iterrows():
        same = light.wall_ms.get(row.step, float("nan"))
        stages = " ".join(f"{s} {row[f'host_{s}_ms']:.1f}" for s in HOST_STAGES)
        print(
            f"  full step {row.step} ({row.phase}, {row.num_tokens} tokens): {row.wall_ms:.1f} ms "
            f"(light {same:.1f}); profiler {row.profiler_ms:.1f}; host {stages}"
        )


if __name__ == "__main__":
    main()
