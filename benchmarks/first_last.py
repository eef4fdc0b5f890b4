"""Does the first run of a comparison pay for the engine's first use? One setting measured
first and last in `compare`, on an engine warmed up when built and on one that was not, each in
a fresh process (a process that already ran the model has paid part of its first use).

    python benchmarks/first_last.py [--model smollm2] [--repeats 3] [--requests 3]

For each engine: what building it took (and its warm-up), then setting A's first step and p50
time to first token in each of its repeats (A runs first of all, B between A's repeats), and
the first repeat against the last beside their noise: the range of the later repeats and the
bootstrap over each run's requests (`viz.noise`).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from workbench.core import SamplingParams
from workbench.workbench import Workbench


def requests(count: int, seed: int = 0) -> list[tuple]:
    rng = random.Random(seed)
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)
    return [
        ([rng.randrange(1000, 20000) for _ in range(rng.randint(16, 40))], sampling, 0)
        for _ in range(count)
    ]


def measure(model: str, warmup: bool, repeats: int, count: int) -> dict:
    from workbench.viz import compare_table

    started = time.perf_counter()
    wb = Workbench(model, warmup=warmup)
    build_s = time.perf_counter() - started
    threads = torch.get_num_threads()  # as the engine set them (half the cores on a CPU)
    settings = {"A": dict(max_extend_tokens=16), "B": dict(max_extend_tokens=64)}
    runs = wb.compare(settings, requests(count), progress=False, repeats=repeats)
    wb.check_integrity()
    repeats_a = runs["A"].repeats
    first_ms = [float(r.steps.wall_ms.iloc[0]) for r in repeats_a]
    ttft_ms = [float(r.requests.ttft_s.median() * 1e3) for r in repeats_a]
    table = compare_table({f"A #{i}": r for i, r in enumerate(repeats_a)})
    noise = table["p50 TTFT (ms) ±"].tolist()
    warmup_ms = wb.llm.warmup_ms
    wb.close()
    return dict(
        build_s=build_s,
        warmup_ms=warmup_ms,
        first_ms=first_ms,
        ttft_ms=ttft_ms,
        noise=noise,
        threads=threads,
    )


def report(label: str, m: dict) -> None:
    print(
        f"{label}: built in {m['build_s']:.1f} s (warm-up {m['warmup_ms']:.0f} ms of it), "
        f"{m['threads']} torch threads"
    )
    for i, (step, ttft, noise) in enumerate(zip(m["first_ms"], m["ttft_ms"], m["noise"])):
        print(f"  A, repeat {i}: step 0 {step:7.1f} ms, p50 TTFT {ttft:7.1f} ms (± {noise:.1f})")
    spread = max(m["ttft_ms"][1:]) - min(m["ttft_ms"][1:]) if len(m["ttft_ms"]) > 2 else 0.0
    gap = m["ttft_ms"][0] - m["ttft_ms"][-1]
    print(
        f"  first - last: step 0 {m['first_ms'][0] - m['first_ms'][-1]:+.1f} ms, "
        f"p50 TTFT {gap:+.1f} ms; the later repeats' range {spread:.1f} ms, "
        f"a run's bootstrap ± {max(m['noise']):.1f} ms"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(
        f"{args.model} on {device}; A = chunk 16, "
        f"B = chunk 64; {args.requests} requests at step 0; "
        f"compare(..., repeats={args.repeats}): A, B, A, B, ..."
    )
    report(
        "warmed up at build (the default)", measure(args.model, True, args.repeats, args.requests)
    )
    report("not warmed up (warmup=False)", measure(args.model, False, args.repeats, args.requests))


if __name__ == "__main__":
    main()
