"""`python -m workbench chat`: a conversation in the terminal, answers streamed, and on request
the steps that made each answer.

    python -m workbench chat --model smollm2 [--max-tokens 256] [--temperature 0.7] [--steps]
"""

from __future__ import annotations

import argparse
import sys

from .core import SamplingParams
from .serve.output import Decoder
from .workbench import Workbench

HELP = "/steps shows each answer's steps, /reset starts over, /exit ends"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="model name or path")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--max-tokens", type=int, default=256, help="the longest answer, in tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--system", default=None, help="a system message to start with")
    p.add_argument("--steps", action="store_true", help="print each answer's steps")


def run(args: argparse.Namespace, read=input, write=sys.stdout.write) -> None:
    wb = Workbench(args.model, device=args.device, record="light")
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages, show_steps = list(system), args.steps
    write(f"{args.model} on {wb.engine.device}; {HELP}\n")
    try:
        while True:
            try:
                line = read("> ").strip()
            except EOFError:
                break
            if line in ("/exit", "/quit"):
                break
            if line == "/steps":
                show_steps = not show_steps
                write(f"(steps {'shown' if show_steps else 'hidden'})\n")
                continue
            if line == "/reset":
                messages = list(system)
                write("(a new conversation)\n")
                continue
            if not line:
                continue
            messages.append({"role": "user", "content": line})
            answer, records = _answer(wb, messages, sampling, write)
            messages.append({"role": "assistant", "content": answer})
            if show_steps:
                write(_steps(records))
    finally:
        wb.close()


def _answer(wb: Workbench, messages: list[dict], sampling: SamplingParams, write):
    encoded = wb.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    uid = wb.add_request([int(t) for t in ids], sampling)
    decoder = Decoder(wb.tokenizer, wb.engine.model_config.vocab_size)
    text, records = [], []
    while True:
        record = wb.step()
        if record is None:
            break
        records.append(record)
        for row in record.rows:
            if row.uid == uid and row.token is not None:
                piece = decoder.add([row.token])
                text.append(piece)
                write(piece)
        if any(row.uid == uid and row.finish for row in record.rows):
            break
    write("\n")
    return "".join(text), records


def _steps(records) -> str:
    lines = [
        f"  step {r.step}: {r.phase}, {r.size} request{'s' * (r.size != 1)}, "
        f"{r.num_tokens} token{'s' * (r.num_tokens != 1)}, {r.wall_ms:.1f} ms"
        for r in records
    ]
    return "\n".join(lines) + "\n"
