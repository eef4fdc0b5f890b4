"""What an open dashboard costs a run: the quickstart's workload (notebook 01) run to the end with
no dashboard, then with one whose views redraw as the run goes, on the same workbench.

    python -m workbench.bench.dashboard_cost [--model smollm2] [--record full] [--repeat 3]

Counts the Python side (building the charts and widget state); a browser draws them afterwards,
on its own clock.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ..core import SamplingParams
from ..workbench import Workbench

QUESTIONS = {
    "What is the capital of France?": 16,
    "Write a haiku about the sea.": 32,
    "Name three prime numbers.": 16,
    "Give one tip for clean Python code.": 24,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--record", default="full", choices=["light", "full"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    wb = Workbench(args.model, max_extend_tokens=32, max_running_reqs=3, record=args.record)
    for question, max_tokens in QUESTIONS.items():
        chat = [{"role": "user", "content": question}]
        prompt = wb.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        wb.add_request(prompt, SamplingParams(max_tokens=max_tokens))
    wb.run(progress=False)  # warm-up
    without, with_view, redraws = [], [], []
    for _ in range(args.repeat):
        wb.reset(again=True)
        start = time.perf_counter()
        wb.run(progress=False)
        without.append(time.perf_counter() - start)
        wb.reset(again=True)
        dash = wb.dashboard()
        count, draw = [0], dash._redraw

        def counted(count=count, draw=draw) -> None:
            count[0] += 1
            draw()

        dash._redraw = counted
        start = time.perf_counter()
        dash.buttons["Run"].click()
        with_view.append(time.perf_counter() - start)
        redraws.append(count[0])
        dash.close()
    steps = len(wb.history)
    a, b = statistics.median(without), statistics.median(with_view)
    print(
        f"{args.model}, record={args.record}, {steps} steps, {torch.get_num_threads()} threads: "
        f"run {a:.2f} s without a dashboard, {b:.2f} s with one ({b / a:.2f}x; "
        f"{statistics.median(redraws):.0f} redraws)"
    )


if __name__ == "__main__":
    main()
