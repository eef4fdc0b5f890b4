"""`python -m workbench demo`: a real model through our scheduler, one line per step."""

from __future__ import annotations

import json
import time
from argparse import Namespace

from .core import SamplingParams
from .llm import LLM
from .models.catalog import DATA_DIR
from .scheduler.scheduler import StepOutcome


def describe(outcome: StepOutcome) -> str:
    """One line: step, phase, requests and tokens, and each request's slice of work."""
    rows = outcome.rows
    if outcome.batch.is_prefill:
        work = ", ".join(f"#{r.uid} {r.kind} [{r.cached_len}:{r.device_len}]" for r in rows)
    else:
        work = " ".join(f"#{r.uid}" for r in rows)
    done = "".join(f"  done #{r.uid} ({r.finish_reason})" for r in outcome.finished)
    tokens = sum(r.extend_len for r in rows)
    phase = outcome.batch.phase
    return (
        f"step {outcome.index:3d}  {phase:<7} {len(rows):2d} reqs {tokens:4d} tokens | {work}{done}"
    )


def run_demo(args: Namespace) -> None:
    spec = json.loads((DATA_DIR / "prompts" / "demo.json").read_text())
    t0 = time.perf_counter()
    llm = LLM(
        args.model,
        device=args.device,
        max_extend_tokens=args.max_extend_tokens,
        page_size=args.page_size,
        cache=args.cache,
    )
    print(
        f"model {args.model} on {llm.engine.device} ({llm.engine.dtype}), "
        f"{llm.engine.num_pages} KV pages of {llm.config.page_size}, "
        f"token budget {llm.config.max_extend_tokens}; loaded in {time.perf_counter() - t0:.1f}s"
    )
    prompts, params = [], []
    for item in spec["questions"]:
        messages = [
            {"role": "system", "content": spec["system"]},
            {"role": "user", "content": item["q"]},
        ]
        prompts.append(
            llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )
        params.append(SamplingParams(max_tokens=item["max_tokens"]))
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, on_step=lambda o: print(describe(o)))
    seconds = time.perf_counter() - t0
    llm.check_integrity()
    print()
    total = 0
    for item, out in zip(spec["questions"], outputs):
        total += out["completion_tokens"]
        print(f"#{out['uid']} Q: {item['q']}")
        answer = out["text"].strip()
        print(f"   A: {answer}  [{out['completion_tokens']} tokens, {out['finish_reason']}]")
    print(
        f"\n{total} tokens in {seconds:.1f}s ({total / seconds:.1f} tokens/s); KV pool integrity ok"
    )
