"""What scoring a prompt costs: the same prompts run for one token without and with
`SamplingParams(prompt_logprobs=n)`, which computes the LM head over every prompt position (and
takes nothing from the prefix cache, so the runs without it get no cache either: `cache="naive"`).

    python benchmarks/prompt_logprobs.py [--model smollm2] [--prompts 8] [--words 120] [--repeat 5]

Prints each setting's median wall time over the repeats with their range, and the ratio to the
run without.
"""

from __future__ import annotations

import argparse
import statistics
import time

from workbench import LLM, SamplingParams

TEXT = "The history of the printing press begins in the fifteenth century, when presses spread "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--words", type=int, default=120, help="words a prompt, about")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()

    llm = LLM(args.model, device=args.device, max_running_reqs=args.prompts, cache="naive")
    words = TEXT.split()
    text = " ".join(words[i % len(words)] for i in range(args.words))
    prompts = [llm.encode(f"{i}: {text}") for i in range(args.prompts)]
    llm.generate(prompts[:2], SamplingParams(max_tokens=2))  # first use, not measured
    print(
        f"{args.model} on {llm.engine.device}: {args.prompts} prompts of about "
        f"{len(prompts[0])} tokens, one output token each; {args.repeat} repeats"
    )
    settings = {
        "without": SamplingParams(max_tokens=1),
        "prompt_logprobs=1": SamplingParams(max_tokens=1, prompt_logprobs=1),
        "prompt_logprobs=20": SamplingParams(max_tokens=1, prompt_logprobs=20),
    }
    base = None
    for name, sampling in settings.items():
        seconds = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            llm.generate(prompts, sampling)
            seconds.append(time.perf_counter() - started)
        median = statistics.median(seconds)
        base = base or median
        print(
            f"{name:20} median {median * 1e3:8.1f} ms (range {min(seconds) * 1e3:.1f}-"
            f"{max(seconds) * 1e3:.1f}), {median / base:.2f}x without"
        )
    llm.check_integrity()
    llm.close()


if __name__ == "__main__":
    main()
