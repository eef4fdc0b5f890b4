"""Prefix sharing: requests with a common system prompt, radix cache against naive, same run.

    python benchmarks/prefix_sharing.py [--model smollm2] [--requests 32] [--prefix 200]

Prints the prefix hit rate (prompt tokens served from the cache), the prefill tokens computed and
saved, and the wall time of the workload with each cache.
"""

from __future__ import annotations

import argparse
import random
import time

from workbench.core import SamplingParams
from workbench.llm import LLM


def workload(requests: int, prefix: int, suffix: tuple[int, int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(100, 10000) for _ in range(prefix)]
    return [
        system + [rng.randrange(100, 10000) for _ in range(rng.randint(*suffix))]
        for _ in range(requests)
    ]


def measure(llm: LLM, prompts: list[list[int]], max_tokens: int) -> dict:
    computed = 0

    def count(record) -> None:
        nonlocal computed
        computed += sum(r.extend_len for r in record.rows if r.kind != "decode")

    start = time.perf_counter()
    outputs = llm.generate(
        prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True), on_step=count
    )
    seconds = time.perf_counter() - start
    llm.check_integrity()
    prompt_tokens = sum(o["prompt_tokens"] for o in outputs)
    cached = sum(o["cached_tokens"] for o in outputs)
    return dict(
        seconds=seconds,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        computed=computed,
        tokens=[o["token_ids"] for o in outputs],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prefix", type=int, default=200)
    parser.add_argument("--suffix", type=int, nargs=2, default=[50, 300])
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    prompts = workload(args.requests, args.prefix, tuple(args.suffix))
    results = {}
    for cache in ("naive", "radix"):
        llm = LLM(args.model, cache=cache)
        llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=2))  # warm-up, shares nothing
        results[cache] = measure(llm, prompts, args.max_tokens)
    naive, radix = results["naive"], results["radix"]
    print(
        f"{args.requests} requests, {args.prefix}-token shared prefix, suffixes "
        f"{args.suffix[0]}-{args.suffix[1]} tokens, {args.max_tokens} output tokens, "
        f"model {args.model}"
    )
    head = ("cache", "prompt tok", "cached", "hit rate", "computed", "seconds")
    print("{:<6} {:>10} {:>7} {:>8} {:>9} {:>8}".format(*head))
    for name, r in results.items():
        rate = r["cached_tokens"] / r["prompt_tokens"]
        print(
            f"{name:<6} {r['prompt_tokens']:>10} {r['cached_tokens']:>7} {rate:>8.1%} "
            f"{r['computed']:>9} {r['seconds']:>8.2f}"
        )
    saved = naive["computed"] - radix["computed"]
    print(
        f"prefill tokens saved: {saved} ({saved / naive['computed']:.1%}); "
        f"wall time radix/naive: {radix['seconds'] / naive['seconds']:.2f}; "
        f"same tokens: {naive['tokens'] == radix['tokens']}"
    )


if __name__ == "__main__":
    main()
