"""`python -m workbench demo`: a real model through our scheduler, one line per step, then the
answers, and a self-contained HTML report of the run."""

from __future__ import annotations

import json
import time
from argparse import Namespace
from pathlib import Path

from .core import SamplingParams
from .flags import llm_options
from .models.catalog import DATA_DIR
from .scheduler.record import StepRecord
from .workbench import Workbench


def describe(record: StepRecord) -> str:
    """One line: step, phase, requests and tokens, and each request's slice of work."""
    rows = record.rows
    decoding = " ".join(f"#{r.uid}" for r in rows if r.kind == "decode")
    prefilling = ", ".join(
        f"#{r.uid} {r.kind} [{r.cached_len - r.extend_len}:{r.cached_len}]"
        for r in rows
        if r.kind != "decode"
    )
    work = " + ".join(part for part in (decoding, prefilling) if part)
    waiting = sorted({a.reason for a in record.rejected})
    wait = f"  (waiting: {', '.join(waiting)})" if waiting else ""
    done = "".join(f"  done #{r.uid} ({r.finish})" for r in rows if r.finish)
    head = f"step {record.step:3d}  {record.phase:<7} {_column(record.size, 'request', 2)}"
    return f"{head} {_column(record.num_tokens, 'token', 4)} | {work}{done}{wait}"


def _column(n: int, noun: str, width: int) -> str:
    """A count `width` digits wide and its noun padded to the plural's width: "1 request " lines
    up with "4 requests"."""
    word = noun if n == 1 else f"{noun}s"
    return f"{n:{width}d} {word:<{len(noun) + 1}}"


def run_demo(args: Namespace) -> None:
    from .viz.causes import counted

    spec = json.loads((DATA_DIR / "prompts" / "demo.json").read_text())
    out = Path(args.out)
    t0 = time.perf_counter()
    wb = Workbench(args.model, **llm_options(args))
    engine = wb.engine
    print(
        f"model {args.model} on {engine.device} ({engine.dtype}), {engine.num_pages:,} KV pages of "
        f"{counted(wb.config.page_size, 'token')}, token budget {wb.config.max_extend_tokens}, "
        f"{wb.config.max_running_reqs} request slots, {wb.config.cache} cache, {wb.config.policy}; "
        f"loaded in {time.perf_counter() - t0:.1f}s"
    )
    questions = spec["questions"]
    for item in questions:
        messages = [
            {"role": "system", "content": spec["system"]},
            {"role": "user", "content": item["q"]},
        ]
        text = wb.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        wb.add_request(text, SamplingParams(max_tokens=item["max_tokens"]))
    t0 = time.perf_counter()
    while (record := wb.step()) is not None:
        print(describe(record))
    seconds = time.perf_counter() - t0
    wb.check_integrity()
    print()
    outputs = wb.outputs()
    for item, output in zip(questions, outputs):
        print(f"#{output['uid']} Q: {item['q']}")
        answer = output["text"].strip()
        made = counted(output["completion_tokens"], "token")
        print(f"   A: {answer}  [{made}, {output['finish_reason']}]")
    tokens = sum(o["completion_tokens"] for o in outputs)
    cached = sum(o["cached_tokens"] for o in outputs)
    print(
        f"\n{tokens} tokens in {seconds:.1f}s ({tokens / seconds:.1f} tokens/s, "
        f"record={args.record}); {cached} prompt tokens served from the prefix cache; "
        "KV pool integrity ok"
    )
    run = wb.save(out / "run.parquet")
    report = wb.report(out / "report.html", title=f"workbench demo: {args.model}")
    from .viz.charts import BY_NAME
    from .viz.report import focus_step, save_png

    step = focus_step(wb.history)
    for name in ("batch_composition", "kv_usage", "page_table", "ledger_bars"):
        chart = BY_NAME[name]
        save_png(chart.draw(wb.history, step if chart.per_step else None), out / f"{name}.png")
    print(f"run saved to {run}; charts as PNG in {out}/")
    print(f"report: {report.resolve()}")
