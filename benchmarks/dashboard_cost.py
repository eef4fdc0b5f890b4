"""What an open dashboard costs a run: the quickstart's workload (notebook 01) run to the end with
no dashboard, then with one open, run from a cell (`wb.run()`) and from its Run button, on the
same workbench.

    python benchmarks/dashboard_cost.py [--model smollm2] [--record full] [--repeat 3]
        [--threads 1]

Counts the Python side (building the charts and widget state); a browser draws them on its own
clock, on the same cores (docs/performance.md, "The dashboard": what it costs in JupyterLab).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from workbench.core import SamplingParams
from workbench.workbench import Workbench

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
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    wb = Workbench(args.model, max_extend_tokens=32, max_running_reqs=3, record=args.record)
    for question, max_tokens in QUESTIONS.items():
        chat = [{"role": "user", "content": question}]
        prompt = wb.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        wb.add_request(prompt, SamplingParams(max_tokens=max_tokens))
    wb.run(progress=False)  # warm-up
    times: dict[str, list[float]] = {"without": [], "from a cell": [], "from Run": []}
    redraws: list[int] = []

    def in_a_cell() -> None:
        wb.run(progress=False)

    for _ in range(args.repeat):
        times["without"].append(_timed(wb, in_a_cell))
        dash = wb.dashboard()
        count, draw = [0], dash._redraw

        def counted(count=count, draw=draw) -> None:
            count[0] += len(wb.history) > 0  # the charts drawn, not emptied by the reset
            draw()

        dash._redraw = counted
        times["from a cell"].append(_timed(wb, in_a_cell))
        times["from Run"].append(_timed(wb, dash.buttons["Run"].click))
        redraws.append(count[0] / 2)
        dash.close()
    base = statistics.median(times["without"])
    with_view = ", ".join(
        f"{statistics.median(t):.2f} s {name} ({statistics.median(t) / base:.2f}x)"
        for name, t in times.items()
        if name != "without"
    )
    print(
        f"{args.model}, record={args.record}, {len(wb.history)} steps, "
        f"{torch.get_num_threads()} threads: run {base:.2f} s without a dashboard; with one "
        f"open {with_view}; {statistics.median(redraws):.1f} redraws a run"
    )


def _timed(wb: Workbench, run: Callable[[], object]) -> float:
    """Seconds of one run of the same requests from step 0 (`run`: what starts it)."""
    wb.reset(again=True)
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
