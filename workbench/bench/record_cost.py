"""What recording costs: step time with record="off", "light" and "full", same work, same run.

    python -m workbench.bench.record_cost [--model smollm2] [--requests 8] [--tokens 32]

Runs the levels in turn, `--repeat` rounds (naive cache, so every round does the same work), and
prints the median step time of each and its overhead against "off".
"""

from __future__ import annotations

import argparse
import statistics
import time

from ..config import RECORD_LEVELS
from ..core import SamplingParams
from ..llm import LLM
from .vs_hf import PROMPTS

LEVELS = RECORD_LEVELS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    prompts = (PROMPTS * (args.requests // len(PROMPTS) + 1))[: args.requests]
    sp = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    llms = {level: LLM(args.model, cache="naive", record=level) for level in LEVELS}
    for llm in llms.values():
        llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    per_step: dict[str, list[float]] = {level: [] for level in LEVELS}
    for _ in range(args.repeat):
        for level, llm in llms.items():
            steps = []
            start = time.perf_counter()
            llm.generate(prompts, sp, on_step=steps.append)
            per_step[level].append((time.perf_counter() - start) / len(steps) * 1e3)
            llm.history.records.clear()
    base = statistics.median(per_step["off"])
    device = llms["off"].engine.device
    print(
        f"{args.model} on {device}, {args.requests} requests x {args.tokens} tokens, "
        f"median of {args.repeat} rounds"
    )
    for level in LEVELS:
        ms = statistics.median(per_step[level])
        print(f"record={level:<5}  {ms:8.2f} ms/step  overhead {100 * (ms / base - 1):+6.1f}%")


if __name__ == "__main__":
    main()
