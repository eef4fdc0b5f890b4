"""`python -m workbench chat`: a conversation in the terminal, answers streamed, and on request
the steps that made each answer.

    python -m workbench chat --model smollm2 [--max-tokens 256] [--temperature 0.7] [--steps]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
import threading

from .core import SamplingParams
from .flags import flag_type, temperature_flag
from .serve.output import Decoder
from .workbench import Workbench

COMMANDS = {
    "/steps": "shows or hides each answer's steps",
    "/reset": "starts a new conversation",
    "/help": "lists these",
    "/exit": "ends, as do /quit and Ctrl-D",
}
HELP = "; ".join(f"{name} {what}" for name, what in COMMANDS.items())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="model name or path")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument(
        "--max-tokens",
        type=flag_type("max_tokens", int, lambda n: SamplingParams(max_tokens=n).max_tokens),
        default=256,
        help="the longest answer, in tokens",
    )
    p.add_argument("--temperature", type=temperature_flag, default=0.0, help="0: greedy")
    p.add_argument("--system", default=None, help="a system message to start with")
    p.add_argument("--steps", action="store_true", help="print each answer's steps")


def run(args: argparse.Namespace, read=input, write=sys.stdout.write) -> None:
    wb = Workbench(args.model, device=args.device, record="light")
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages, show_steps = list(system), args.steps
    write(f"{args.model} on {wb.engine.device}; {HELP}; Ctrl-C stops an answer\n")
    try:
        while True:
            try:
                line = read("> ").strip()
            except (EOFError, KeyboardInterrupt):
                write("\n")
                break
            if not line:
                continue
            if line.startswith("/") and " " not in line:
                if line in ("/exit", "/quit"):
                    break
                if line == "/steps":
                    show_steps = not show_steps
                    write(f"(steps {'shown' if show_steps else 'hidden'})\n")
                elif line == "/reset":
                    messages = list(system)
                    write("(a new conversation)\n")
                else:
                    said = "" if line == "/help" else f"unknown command {line}; "
                    write(f"({said}{HELP})\n")
                continue
            messages.append({"role": "user", "content": line})
            try:
                uid, asked, at_context = _send(wb, messages, sampling)
            except ValueError as e:  # refused before it was queued: the conversation is as it was
                messages.pop()
                write(f"(not sent: {e}; /reset starts a new conversation)\n")
                continue
            answer, finish, records = _stream(wb, uid, write)
            _say_end(finish, asked, at_context, wb.engine.max_seq_len, write)
            messages.append({"role": "assistant", "content": answer})
            wb.check_integrity()  # (stopped or not, the answer's pages are back in the pool)
            if show_steps:
                write(_steps(records))
    finally:
        wb.close()


def _send(wb: Workbench, messages: list[dict], sampling: SamplingParams):
    """Queue the answer to `messages`: its uid, its SamplingParams and whether the context's end
    shortened it (near the end an answer is shortened, not refused, as the server's chat is).
    ValueError, before anything is queued, where the conversation has outgrown the context."""
    encoded = wb.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = [int(t) for t in (encoded["input_ids"] if hasattr(encoded, "keys") else encoded)]
    room = wb.engine.max_seq_len - len(ids)
    if room < 1:
        raise ValueError(
            f"the conversation has {len(ids)} tokens, the context {wb.engine.max_seq_len}"
        )
    asked = dataclasses.replace(sampling, max_tokens=min(sampling.max_tokens, room))
    return wb.add_request(ids, asked), asked, room <= sampling.max_tokens


def _stream(wb: Workbench, uid: int, write) -> tuple[str, str | None, list]:
    """Step the engine until request `uid` ends, writing its words as they come: its text, how
    it ended ("stop", "length", or "stopped" by Ctrl-C) and the steps' records. Ctrl-C stops it
    between steps (the request is aborted, the engine left whole); the words so far are kept."""
    decoder = Decoder(wb.tokenizer, wb.engine.model_config.vocab_size)
    text, records, finish = [], [], None
    with _interrupts() as stopped:
        while finish is None:
            if stopped():
                wb.abort(uid)
                finish = "stopped"
                break
            record = wb.step()
            if record is None:
                break
            records.append(record)
            for row in record.rows:
                if row.uid == uid and row.token is not None:
                    piece = decoder.add([row.token])
                    text.append(piece)
                    write(piece)
                if row.uid == uid and row.finish:
                    finish = row.finish
    return "".join(text), finish, records


def _say_end(finish: str | None, asked: SamplingParams, at_context: bool, context: int, write):
    if finish == "stopped":
        write(" (stopped)")
    elif finish == "length" and at_context:
        write(f" (cut at the context's end, {context} tokens: /reset starts over)")
    elif finish == "length":
        write(f" (cut at {asked.max_tokens} tokens: --max-tokens allows more)")
    write("\n")


@contextlib.contextmanager
def _interrupts():
    """Ctrl-C while answering sets a flag read between steps, instead of raising inside one.
    Yields the flag's reader (never set off the main thread, where no handler can go)."""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield pressed.is_set
        return
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.set())
    try:
        yield pressed.is_set
    finally:
        signal.signal(signal.SIGINT, previous)


def _steps(records) -> str:
    lines = [
        f"  step {r.step}: {r.phase}, {r.size} request{'s' * (r.size != 1)}, "
        f"{r.num_tokens} token{'s' * (r.num_tokens != 1)}{_cached(r)}, {r.wall_ms:.1f} ms"
        for r in records
    ]
    return "\n".join(lines) + "\n"


def _cached(record) -> str:
    """What the prefix cache gave the prompts this step began: a conversation's earlier turns are
    cached, so each answer's prompt step computes only the new message. NOTE: a prompt's later
    chunks start past what its own earlier chunks computed, which the cache did not give."""
    cached = sum(
        row.cached_tokens
        for row in record.rows
        if row.kind != "decode" and row.cached_len - row.extend_len == row.cached_tokens
    )
    return f" ({cached} more from the prefix cache)" if cached else ""
