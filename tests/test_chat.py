"""The terminal chat (`python -m workbench chat`) as a person uses it: commands that never reach
the model, Ctrl-C stopping an answer between steps, a conversation that outgrows the context.
`run` is driven in-process with its `read` and `write` (the process itself: test_serve.py)."""

from __future__ import annotations

import argparse
import os
import signal

import pytest

from workbench import chat

MODEL = "tiny-llama"  # SmolLM2's tokenizer and chat template, random weights: long answers


def _args(**over) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    chat.add_arguments(p)
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in over.items()]
    return p.parse_args(["--model", MODEL, *flags])


def _chat(lines: list[str], on_write=None, **over) -> list[str]:
    """Run a chat on `lines`; what it wrote, one string per write."""
    said: list[str] = []
    feed = iter(lines)

    def read(prompt: str) -> str:
        said.append(prompt)
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    def write(text: str) -> None:
        said.append(text)
        if on_write is not None:
            on_write(text, said)

    chat.run(_args(**over), read=read, write=write)
    return said


def _answers(said: list[str]) -> list[str]:
    """The text written after each prompt, up to the next one."""
    out, current = [], None
    for piece in said:
        if piece == "> ":
            if current is not None:
                out.append(current)
            current = ""
        elif current is not None:
            current += piece
    return out


def test_commands_are_answered_by_the_chat_not_sent_to_the_model():
    said = _chat(["/help", "/stpes", "/steps", "Hello", "/exit", "never read"], max_tokens=3)
    help_, unknown, steps, answer = _answers(said)[:4]
    for name in chat.COMMANDS:
        assert name in help_
    assert unknown.startswith("(unknown command /stpes;") and "/steps" in unknown
    assert steps == "(steps shown)\n"
    assert "step 0: prefill, 1 request" in answer  # the first step of the run: nothing before
    assert "never read" not in "".join(said)


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_ctrl_c_stops_an_answer_between_steps_and_the_chat_goes_on():
    sent = []

    def press_ctrl_c_once(text: str, said: list[str]) -> None:
        if not sent and said.count("> ") == 1 and text.strip():  # the first answer's first words
            sent.append(text)
            os.kill(os.getpid(), signal.SIGINT)

    said = _chat(
        ["Tell me a long story", "And another"],
        on_write=press_ctrl_c_once,
        max_tokens=40,
        steps=True,
    )
    first, second = _answers(said)[:2]
    assert sent and "(stopped)" in first
    stopped_steps = [line for line in first.splitlines() if line.strip().startswith("step ")]
    # the key came as the prompt's step wrote the first token: no step after it
    assert len(stopped_steps) == 1 and "prefill" in stopped_steps[0]
    assert "(stopped)" not in second and "step " in second  # the engine answered on
    # (run checks the pool after every answer: an aborted request's pages are back)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_answer_is_cut_at_the_context_and_a_longer_conversation_is_not_sent():
    from workbench import Workbench

    with Workbench(MODEL) as wb:
        context = wb.engine.max_seq_len
        template = wb.tokenizer.apply_chat_template

        def length(system: str) -> int:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
            encoded = template(messages, add_generation_prompt=True)
            return len(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

        system = "word " * (context - length("") - 3)
        while length(system) > context - 4:
            system = system[5:]
        room = context - length(system)
    assert 1 <= room <= 8
    said = _chat(["Hi", "Hi again", "/reset", "Hi"], system=system.strip(), max_tokens=50)
    cut, refused, reset, after = _answers(said)[:4]
    assert cut.endswith(f"(cut at the context's end, {context} tokens: /reset starts over)\n")
    assert (
        refused.startswith("(not sent: the conversation has ") and f"context {context}" in refused
    )
    assert reset == "(a new conversation)\n"  # the system message stays: still no room for 50
    assert after.endswith(f"(cut at the context's end, {context} tokens: /reset starts over)\n")


def test_each_answer_s_prompt_step_says_what_the_prefix_cache_gave_it():
    from workbench import Workbench

    said = _chat(["/steps", "Hello", "And then?"], max_tokens=4)
    first, second = _answers(said)[1:3]

    def prompt_step(answer: str) -> str:
        return next(line for line in answer.splitlines() if ": prefill, 1 request, " in line)

    assert "prefix cache" not in prompt_step(first)  # nothing cached before the first turn
    line = prompt_step(second)
    computed = int(line.split("1 request, ")[1].split(" tokens")[0])
    cached = int(line.split(" tokens (")[1].split(" more from the prefix cache)")[0])
    # the two add up to the whole conversation as the chat sends it (the first answer's text
    # re-encoded by the template), and the cache held at most the first turn's tokens and answer
    cut = " (cut at 4 tokens: --max-tokens allows more)"
    answer = first.split("\n  step ")[0].removesuffix(cut)
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And then?"},
    ]
    with Workbench(MODEL) as wb:
        encoded = wb.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        asked = wb.tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    first_ids = asked["input_ids"] if hasattr(asked, "keys") else asked
    assert 0 < cached <= len(first_ids) + 4 and computed + cached == len(ids)


def test_a_chunked_prompt_says_what_the_prefix_cache_gave_it_once():
    from workbench import SamplingParams, Workbench

    with Workbench(MODEL, max_extend_tokens=16) as wb:
        first = list(range(100, 160))
        wb.add_request(first, SamplingParams(max_tokens=2))
        wb.run()
        wb.add_request(first + list(range(300, 340)), SamplingParams(max_tokens=2))
        records = []
        while (record := wb.step()) is not None:
            records.append(record)
        cached = wb.history.requests.cached_tokens.iloc[-1]
    lines = chat._steps(records).splitlines()
    chunks = [line for line in lines if ": prefill, 1 request, " in line]
    assert len(chunks) > 1 and 0 < cached <= len(first)  # the new part in chunks, past a hit
    assert f"({cached} more from the prefix cache)" in chunks[0]
    assert not any("prefix cache" in line for line in lines if line != chunks[0])
