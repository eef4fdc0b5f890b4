"""CPU throughput of our engine beside Hugging Face `generate`, same prompts, same process.

    python benchmarks/vs_hf.py [--model smollm2] [--tokens 64] [--concurrency 1 8]

Prints output tokens/s for each concurrency (prompts run together). Greedy, ignore EOS, float32.
"""

from __future__ import annotations

import argparse
import time

import torch

from workbench.core import SamplingParams
from workbench.llm import LLM
from workbench.models import resolve

PROMPTS = [
    "The history of the printing press begins",
    "Write a short story about a robot who learns to paint.",
    "In mathematics, a prime number is",
    "The three most important ideas in computer science are",
    "Dear diary, today I",
    "A recipe for a simple tomato soup:",
    "The main causes of the French Revolution were",
    "Explain how a bicycle stays upright while moving.",
]


def hf_generate(model, tokenizer, prompts: list[str], max_new: int) -> int:
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(
            **batch, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False
        )
    return (out.shape[1] - batch.input_ids.shape[1]) * len(prompts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM

    llm = LLM(args.model, device="cpu", dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(resolve(args.model), dtype=torch.float32).eval()
    sp = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    llm.generate(PROMPTS[:2], SamplingParams(max_tokens=4))  # warm-up
    hf_generate(hf, llm.tokenizer, PROMPTS[:2], 4)
    print(
        f"model {args.model}, cpu float32, {torch.get_num_threads()} threads, "
        f"{args.tokens} tokens per request, median of {args.repeat}"
    )
    print(f"{'concurrency':>11} {'workbench tok/s':>16} {'HF generate tok/s':>18} {'ratio':>6}")
    for n in args.concurrency:
        prompts = (PROMPTS * (n // len(PROMPTS) + 1))[:n]
        ours, theirs = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            outputs = llm.generate(prompts, sp)
            ours.append(sum(o["completion_tokens"] for o in outputs) / (time.perf_counter() - t))
            t = time.perf_counter()
            count = hf_generate(hf, llm.tokenizer, prompts, args.tokens)
            theirs.append(count / (time.perf_counter() - t))
        llm.check_integrity()
        a, b = sorted(ours)[len(ours) // 2], sorted(theirs)[len(theirs) // 2]
        print(f"{n:>11} {a:>16.1f} {b:>18.1f} {a / b:>6.2f}")


if __name__ == "__main__":
    main()
