"""The OpenAI-compatible server, driven by the real `openai` client (and raw HTTP where a client
would not send what is tested): completions and chat, streamed and whole, equal to
`LLM.generate`; cached tokens; clients that leave; bad requests answered 400 while the others
are served; a full queue answered 503; pause, step and resume with a client waiting; /metrics
read by prometheus_client's parser; the server as a process and the terminal chat."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from workbench import LLM, SamplingParams, Workbench

from .conftest import PROMPTS

openai = pytest.importorskip("openai")
MODEL = "tiny-llama"  # SmolLM2's tokenizer and chat template, two small layers
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def served():
    """A workbench serving from a background thread, as a notebook's `wb.serve()` does."""
    wb = Workbench(MODEL, max_running_reqs=8, max_extend_tokens=64)
    server = wb.serve(port=0)
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60)
    yield wb, server, client
    wb.close()


def greedy(n: int) -> dict:
    return dict(
        max_tokens=n, temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True}
    )


def reference(prompts, n: int) -> list[dict]:
    llm = LLM(MODEL, max_running_reqs=8, max_extend_tokens=64)
    try:
        return llm.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))
    finally:
        llm.close()


def test_completions_whole_and_streamed_equal_generate_token_for_token(served):
    wb, server, client = served
    expected = reference(PROMPTS[:3], 12)
    for prompt, want in zip(PROMPTS[:3], expected):
        whole = client.completions.create(model=MODEL, prompt=prompt, **greedy(12))
        choice = whole.choices[0]
        assert choice.text == want["text"] and choice.model_extra["token_ids"] == want["token_ids"]
        assert choice.finish_reason == "length"
        assert whole.usage.prompt_tokens == want["prompt_tokens"]
        assert whole.usage.completion_tokens == 12
        chunks = list(
            client.completions.create(
                model=MODEL,
                prompt=prompt,
                stream=True,
                stream_options={"include_usage": True},
                **greedy(12),
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
        assert text == want["text"] and ids == want["token_ids"]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices
    # token ids in, as a prompt
    ids = wb.llm.encode(PROMPTS[0])
    by_ids = client.completions.create(model=MODEL, prompt=ids, **greedy(12))
    assert by_ids.choices[0].model_extra["token_ids"] == expected[0]["token_ids"]


def test_chat_through_the_template_equals_generate_on_the_templated_ids(served):
    wb, server, client = served
    messages = [{"role": "user", "content": "Name three colors."}]
    encoded = wb.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    (want,) = reference([ids], 10)
    whole = client.chat.completions.create(model=MODEL, messages=messages, **greedy(10))
    assert whole.choices[0].message.content == want["text"]
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, **greedy(10)
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want["text"]


def test_logprobs_whole_and_streamed_are_the_engines(served):
    """Completions' `logprobs=n` and chat's `logprobs`/`top_logprobs`, whole and streamed, give
    each token the log probability and most likely tokens `LLM.generate` reports, named by
    their text; the pool stays whole."""
    wb, server, client = served
    llm = LLM(MODEL, max_running_reqs=8, max_extend_tokens=64)
    try:
        want = llm.generate(PROMPTS[:2], SamplingParams(max_tokens=6, ignore_eos=True, logprobs=3))
        chat = [{"role": "user", "content": "Name a color."}]
        chat_ids = llm.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        chat_ids = chat_ids["input_ids"] if hasattr(chat_ids, "keys") else chat_ids
        want_chat = llm.generate([list(chat_ids)], SamplingParams(max_tokens=5, logprobs=2))[0]
    finally:
        llm.close()
    text_of = lambda t: wb.llm.tokenizer.decode([t])  # noqa: E731

    for prompt, out in zip(PROMPTS[:2], want):
        whole = client.completions.create(model=MODEL, prompt=prompt, logprobs=3, **greedy(6))
        chunks = client.completions.create(
            model=MODEL, prompt=prompt, logprobs=3, stream=True, **greedy(6)
        )
        streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        for lp in (whole.choices[0].logprobs, *streamed):
            assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
        got = [v for lp in streamed for v in lp.token_logprobs]
        # (float32 rounding: the two requests run in batches of other shapes)
        assert got == pytest.approx(whole.choices[0].logprobs.token_logprobs, abs=1e-5)
        assert got == pytest.approx([lp for lp, _ in out["logprobs"]], abs=1e-5)
        tops = [t for lp in streamed for t in lp.top_logprobs]
        assert [list(t) for t in tops] == [
            [text_of(i) for i, _ in top] for _, top in out["logprobs"]
        ]
        tokens = [t for lp in streamed for t in lp.tokens]
        assert tokens == [text_of(t) for t in out["token_ids"]]
        offsets = [o for lp in streamed for o in lp.text_offset]
        assert offsets == [sum(map(len, tokens[:i])) for i in range(len(tokens))]

    for stream in (False, True):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=chat,
            max_tokens=5,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=stream,
        )
        choices = [c.choices[0] for c in reply if c.choices] if stream else reply.choices
        content = [e for c in choices if c.logprobs for e in c.logprobs.content]
        assert [e.logprob for e in content] == pytest.approx(
            [lp for lp, _ in want_chat["logprobs"]], abs=1e-5
        )
        assert [e.token for e in content] == [text_of(t) for t in want_chat["token_ids"]]
        assert all(e.bytes == list(e.token.encode()) for e in content)
        assert [[t.token for t in e.top_logprobs] for e in content] == [
            [text_of(i) for i, _ in top] for _, top in want_chat["logprobs"]
        ]
    # sampled: the chosen token is among a token's top_logprobs, as OpenAI gives it (logprobs + 1)
    hot = (
        client.completions.create(
            model=MODEL, prompt=PROMPTS[0], logprobs=1, max_tokens=8, temperature=1.5, seed=3
        )
        .choices[0]
        .logprobs
    )
    for token, value, top in zip(hot.tokens, hot.token_logprobs, hot.top_logprobs):
        assert top[token] == value and 1 <= len(top) <= 2
    # a token holding part of a character: its text is U+FFFD, its bytes its own
    partial = wb.llm.tokenizer.encode("\U0001f600")[0]  # the emoji's first token (two bytes)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=chat,
        max_tokens=2,
        temperature=0,
        logprobs=True,
        top_logprobs=1,
        logit_bias={str(partial): 100},
    )
    (first, second) = reply.choices[0].logprobs.content
    assert first.token == "\ufffd" and bytes(first.bytes) == "\U0001f600".encode()[:2]
    top = first.top_logprobs  # (the model's own, before the bias: whole characters here)
    assert all(bytes(t.bytes).decode() == t.token for t in top if t.token != "\ufffd")
    plain = client.completions.create(model=MODEL, prompt=PROMPTS[0], **greedy(2))
    assert plain.choices[0].logprobs is None
    for path, body in (  # what asks for none, as clients may send it
        ("/completions", {"prompt": "hi", "logprobs": False}),
        ("/chat/completions", {"messages": chat, "logprobs": False, "top_logprobs": 0}),
    ):
        reply = httpx.post(server.url + path, json={"model": MODEL, "max_tokens": 2, **body})
        assert reply.status_code == 200 and reply.json()["choices"][0]["logprobs"] is None
    wb.llm.check_integrity()


def test_n_choices_are_each_a_request_sampled_with_its_own_seed(served):
    """`n` choices, whole and streamed, completions and chat: choice i is the request sampled
    with seed + i, as `LLM.generate` gives it; usage counts the prompt once and every choice's
    tokens; nothing leaks."""
    wb, server, client = served
    prompt, seed = PROMPTS[1], 11
    sampled = dict(max_tokens=8, temperature=1.0, top_k=50, ignore_eos=True)
    llm = LLM(MODEL, max_running_reqs=8, max_extend_tokens=64)
    try:
        want = [
            llm.generate([prompt], SamplingParams(seed=seed + i, **sampled))[0]["token_ids"]
            for i in range(3)
        ]
        chat = [{"role": "user", "content": "Name a color."}]
        chat_ids = llm.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        chat_ids = list(chat_ids["input_ids"] if hasattr(chat_ids, "keys") else chat_ids)
        want_chat = [
            llm.generate([chat_ids], SamplingParams(seed=seed + i, **sampled))[0]["text"]
            for i in range(2)
        ]
    finally:
        llm.close()
    assert len({tuple(w) for w in want}) > 1  # the seeds sample different tokens
    body = dict(
        max_tokens=8,
        temperature=1.0,
        seed=seed,
        extra_body={"top_k": 50, "ignore_eos": True, "return_token_ids": True},
    )
    whole = client.completions.create(model=MODEL, prompt=prompt, n=3, **body)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert [c.model_extra["token_ids"] for c in whole.choices] == want
    assert whole.usage.prompt_tokens == len(wb.llm.encode(prompt))
    assert whole.usage.completion_tokens == 24
    chunks = client.completions.create(
        model=MODEL, prompt=prompt, n=3, stream=True, stream_options={"include_usage": True}, **body
    )
    ids: dict[int, list[int]] = {0: [], 1: [], 2: []}
    finishes: dict[int, str] = {}
    last = None
    for chunk in chunks:
        last = chunk
        for c in chunk.choices:
            ids[c.index] += c.model_extra["token_ids"]
            if c.finish_reason is not None:
                finishes[c.index] = c.finish_reason
    assert [ids[i] for i in range(3)] == want
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert not last.choices and last.usage.completion_tokens == 24

    chat_body = dict(max_tokens=8, temperature=1.0, seed=seed, extra_body=body["extra_body"])
    answer = client.chat.completions.create(model=MODEL, messages=chat, n=2, **chat_body)
    assert [c.message.content for c in answer.choices] == want_chat
    streamed = client.chat.completions.create(
        model=MODEL, messages=chat, n=2, stream=True, **chat_body
    )
    texts, roles = {0: "", 1: ""}, set()
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.delta.role:
                roles.add(c.index)
    assert [texts[0], texts[1]] == want_chat and roles == {0, 1}
    # greedy: n equal answers
    same = client.completions.create(model=MODEL, prompt=prompt, n=2, **greedy(5))
    assert same.choices[0].text == same.choices[1].text
    wb.pause()
    try:
        wb.check_integrity()
    finally:
        wb.resume()


def test_a_list_of_prompts_gives_each_its_choices_in_order(served):
    """Completions' `prompt` as a list (text and token ids mixed, as an evaluation harness
    batches them) with n=2: choice 2p + j is prompt p sampled with seed + j, as `LLM.generate`
    gives it, whole and streamed, each echoing its own prompt; usage counts each prompt once."""
    wb, server, client = served
    prompts = [PROMPTS[0], wb.llm.encode(PROMPTS[1]), PROMPTS[2]]
    ids = [wb.llm.encode(p) if isinstance(p, str) else p for p in prompts]
    sampled = dict(max_tokens=5, temperature=1.0, ignore_eos=True)
    llm = LLM(MODEL, max_running_reqs=8, max_extend_tokens=64)
    try:
        want = [
            llm.generate([p], SamplingParams(seed=3 + j, **sampled))[0]["text"]
            for p in ids
            for j in range(2)
        ]
    finally:
        llm.close()
    texts = [p if isinstance(p, str) else wb.llm.decode(p) for p in prompts]
    body = dict(max_tokens=5, temperature=1.0, seed=3, n=2, echo=True)
    whole = client.completions.create(
        model=MODEL, prompt=prompts, extra_body={"ignore_eos": True}, **body
    )
    assert [c.index for c in whole.choices] == list(range(6))
    assert [c.text for c in whole.choices] == [texts[i // 2] + w for i, w in enumerate(want)]
    assert whole.usage.prompt_tokens == sum(map(len, ids))
    assert whole.usage.completion_tokens == 30
    chunks = client.completions.create(
        model=MODEL, prompt=prompts, stream=True, extra_body={"ignore_eos": True}, **body
    )
    streamed = [""] * 6
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == [c.text for c in whole.choices]


def test_echo_gives_the_prompt_and_its_log_probabilities_as_an_evaluation_harness_asks(served):
    """Completions' `echo` (with `logprobs`, as lm-eval's local-completions scores a
    continuation: token ids in, max_tokens 1): the text begins with the prompt, and `logprobs`
    covers its tokens, the first with none, each other as `LLM.generate`'s `prompt_logprobs`
    gives it; whole and streamed alike; without logprobs the text alone; chat has no echo."""
    wb, server, client = served
    prompt = PROMPTS[0]
    ids = wb.llm.encode(prompt)
    llm = LLM(MODEL, max_running_reqs=8, max_extend_tokens=64)
    try:
        asked = SamplingParams(max_tokens=3, ignore_eos=True, logprobs=2, prompt_logprobs=2)
        (want,) = llm.generate([ids], asked)
    finally:
        llm.close()
    text_of = lambda t: wb.llm.tokenizer.decode([t])  # noqa: E731
    want_prompt = [lp for lp, _ in want["prompt_logprobs"][1:]]
    whole = client.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=2, **greedy(3)
    )
    choice = whole.choices[0]
    assert choice.text == prompt + want["text"]
    lp = choice.logprobs
    assert lp.tokens == [text_of(t) for t in ids + want["token_ids"]]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1 : len(ids)] == pytest.approx(want_prompt, abs=1e-5)
    assert lp.token_logprobs[len(ids) :] == pytest.approx(
        [v for v, _ in want["logprobs"]], abs=1e-5
    )
    # each prompt token's most likely, then the prompt's own token where it is not among them
    assert [list(t) for t in lp.top_logprobs[1 : len(ids)]] == [
        list(dict.fromkeys([*(text_of(i) for i, _ in top), text_of(token)]))
        for token, (_, top) in zip(ids[1:], want["prompt_logprobs"][1:])
    ]
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert whole.usage.prompt_tokens == len(ids) and whole.usage.completion_tokens == 3

    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, echo=True, logprobs=2, stream=True, **greedy(3)
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert [t for s in streamed for t in s.tokens] == lp.tokens
    assert [o for s in streamed for o in s.text_offset] == lp.text_offset
    got = [v for s in streamed for v in s.token_logprobs]
    assert got[0] is None and got[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)

    # as lm-eval asks: token ids, one more token, the log probability of the continuation
    scored = httpx.post(
        server.url + "/completions",
        json={"prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0},
        timeout=60,
    ).json()["choices"][0]["logprobs"]
    assert scored["token_logprobs"][1 : len(ids)] == pytest.approx(want_prompt, abs=1e-5)
    plain = client.completions.create(model=MODEL, prompt=prompt, echo=True, **greedy(3))
    assert plain.choices[0].text == prompt + want["text"] and plain.choices[0].logprobs is None
    chat = httpx.post(
        server.url + "/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "echo": True},
        timeout=30,
    )
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "echo"
    wb.pause()
    try:
        wb.check_integrity()
    finally:
        wb.resume()


def test_max_tokens_0_with_echo_scores_the_prompt_and_generates_nothing(served):
    """`max_tokens: 0` with `echo` (as older harnesses score a text): the prompt's text and its
    tokens' log probabilities, `LLM.generate`'s `prompt_logprobs`, and no token of the
    engine's: `finish_reason` "length", no completion tokens; whole, streamed, several prompts
    and choices alike. Without echo, 0 is a 400 that says so."""
    wb, server, client = served
    prompts = [PROMPTS[0], PROMPTS[1]]
    ids = [wb.llm.encode(p) for p in prompts]
    llm = LLM(MODEL, max_running_reqs=8, max_extend_tokens=64)
    try:
        want = llm.generate(ids, SamplingParams(max_tokens=1, prompt_logprobs=3))
    finally:
        llm.close()
    text_of = lambda t: wb.llm.tokenizer.decode([t])  # noqa: E731
    whole = client.completions.create(
        model=MODEL, prompt=prompts[0], echo=True, logprobs=3, max_tokens=0
    )
    (choice,) = whole.choices
    assert choice.text == prompts[0] and choice.finish_reason == "length"
    assert choice.logprobs.tokens == [text_of(t) for t in ids[0]]
    assert choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(
        [lp for lp, _ in want[0]["prompt_logprobs"][1:]], abs=1e-5
    )
    assert whole.usage.prompt_tokens == len(ids[0]) and whole.usage.completion_tokens == 0

    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompts[0], echo=True, logprobs=3, max_tokens=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == prompts[0]
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == choice.logprobs.tokens
    assert chunks[-1].choices[0].finish_reason == "length"

    # token ids, two prompts, two choices each: every choice its prompt's, and nothing more
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1, "n": 2}
    scored = httpx.post(server.url + "/completions", json=body, timeout=60).json()
    assert [c["index"] for c in scored["choices"]] == [0, 1, 2, 3]
    for c in scored["choices"]:
        p = c["index"] // 2
        assert c["logprobs"]["tokens"] == [text_of(t) for t in ids[p]]
        assert c["logprobs"]["token_logprobs"][1:] == pytest.approx(
            [lp for lp, _ in want[p]["prompt_logprobs"][1:]], abs=1e-5
        )
    usage = scored["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == len(ids[0]) + len(ids[1])
    assert usage["completion_tokens"] == 0

    refused = httpx.post(
        server.url + "/completions", json={"prompt": prompts[0], "max_tokens": 0}, timeout=30
    )
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "max_tokens"
    assert "echo" in error["message"], error["message"]
    wb.pause()
    try:
        wb.check_integrity()
    finally:
        wb.resume()


def test_logit_bias_is_the_engines_whole_streamed_and_in_chat(served):
    """`logit_bias` (token ids as strings) is `SamplingParams.logit_bias`: a completion equals
    `LLM.generate` with it, whole and streamed; +100 forces a sampled chat answer's every token."""
    wb, server, client = served
    prompt = PROMPTS[1]
    ids = wb.llm.encode(prompt)
    llm = LLM(MODEL, max_running_reqs=8, max_extend_tokens=64)
    try:
        (plain,) = llm.generate([ids], SamplingParams(max_tokens=5, ignore_eos=True))
        bias = {plain["token_ids"][0]: -100.0, plain["token_ids"][1]: 3.0}
        asked = SamplingParams(max_tokens=5, ignore_eos=True, logit_bias=bias)
        (want,) = llm.generate([ids], asked)
    finally:
        llm.close()
    assert want["token_ids"] != plain["token_ids"]
    sent = {str(t): v for t, v in bias.items()}
    whole = client.completions.create(model=MODEL, prompt=prompt, logit_bias=sent, **greedy(5))
    assert whole.choices[0].model_extra["token_ids"] == want["token_ids"]
    chunks = client.completions.create(
        model=MODEL, prompt=prompt, logit_bias=sent, stream=True, **greedy(5)
    )
    streamed = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
    assert streamed == want["token_ids"]
    forced = wb.llm.encode(" yes")[0]
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say no."}],
        max_tokens=4,
        temperature=1.0,
        seed=5,
        logit_bias={str(forced): 100},
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert chat.choices[0].model_extra["token_ids"] == [forced] * 4
    too_big = httpx.post(
        server.url + "/completions",
        json={"prompt": prompt, "logit_bias": {str(wb.llm.engine.model_config.vocab_size): 1}},
        timeout=30,
    )
    assert too_big.status_code == 400 and "vocabulary" in too_big.json()["error"]["message"]
    assert too_big.json()["error"]["param"] == "logit_bias"


def test_penalties_are_the_engines(served):
    """`presence_penalty`, `frequency_penalty` (OpenAI's) and `repetition_penalty` (vLLM's
    extra) are `SamplingParams`' own: a completion and a chat answer equal `LLM.generate` with
    them on the same ids."""
    wb, server, client = served
    prompt = PROMPTS[0]
    ids = wb.llm.encode(prompt)
    penalties = {"presence_penalty": 1.5, "frequency_penalty": 0.5, "repetition_penalty": 1.3}
    llm = LLM(MODEL, max_running_reqs=8, max_extend_tokens=64)
    try:
        (plain,) = llm.generate([ids], SamplingParams(max_tokens=12, ignore_eos=True))
        asked = SamplingParams(max_tokens=12, ignore_eos=True, **penalties)
        (want,) = llm.generate([ids], asked)
    finally:
        llm.close()
    assert want["token_ids"] != plain["token_ids"]
    extra = {"ignore_eos": True, "return_token_ids": True, "repetition_penalty": 1.3}
    whole = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        extra_body=extra,
    )
    assert whole.choices[0].model_extra["token_ids"] == want["token_ids"]
    defaults = client.completions.create(
        model=MODEL, prompt=prompt, presence_penalty=0, frequency_penalty=0, **greedy(12)
    )
    assert defaults.choices[0].model_extra["token_ids"] == plain["token_ids"]


def test_a_shared_prefix_is_reported_as_cached_tokens(served):
    wb, server, client = served
    prefix = "Zanzibar " + " ".join(["The scheduler admits requests under a token budget."] * 6)
    first = client.completions.create(model=MODEL, prompt=prefix + " First.", **greedy(2))
    second = client.completions.create(model=MODEL, prompt=prefix + " Second.", **greedy(2))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    shared = len(wb.llm.encode(prefix))
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert shared - 2 <= cached <= second.usage.prompt_tokens - 1, (shared, cached)
    # the requests table says which requests came over HTTP, when, and what they found cached
    requests = wb.history.requests.set_index("uid")
    http = requests[requests.source == "http"]
    assert len(http) >= 2 and http.cached_tokens.max() == cached
    assert (http.arrival_s <= http.first_token_s).all()
    # a new prompt in four chunks (64 tokens a step): its own earlier chunks are not the cache's
    fresh = " ".join(f"w{i}q" for i in range(90))
    assert len(wb.llm.encode(fresh)) > 3 * 64
    whole = client.completions.create(model=MODEL, prompt=fresh, **greedy(2))
    echoed = client.completions.create(
        model=MODEL, prompt=fresh + " again", echo=True, logprobs=1, **greedy(2)
    )
    streamed = client.completions.create(
        model=MODEL,
        prompt="Yes " + fresh,
        stream=True,
        stream_options={"include_usage": True},
        **greedy(2),
    )
    usage = [chunk.usage for chunk in streamed if chunk.usage is not None][-1]
    assert whole.usage.prompt_tokens_details.cached_tokens == 0
    # (its prompt's log probabilities: as the engine counted it, whatever that was)
    requests = wb.history.requests
    engine = requests.cached_tokens[requests.prompt_tokens == echoed.usage.prompt_tokens]
    assert echoed.usage.prompt_tokens_details.cached_tokens == engine.iloc[-1]
    assert usage.prompt_tokens_details.cached_tokens == 0


def _finished_by_reason(server) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=30).text
    family = {f.name: f for f in text_string_to_metric_families(text)}
    samples = family["workbench_requests_finished"].samples
    return {s.labels["reason"]: s.value for s in samples if s.name.endswith("_total")}


def test_stop_strings_end_the_text_before_them(served):
    """Whole and streamed, the text ends before the stop string, and the engine stops there
    too: the tokens after it are not computed (a whole answer's too), nor reported or counted."""
    wb, server, client = served
    (want,) = reference([PROMPTS[4]], 16)
    stop = want["text"][5:8]
    assert stop and stop in want["text"]
    before = _finished_by_reason(server)
    got = client.completions.create(model=MODEL, prompt=PROMPTS[4], stop=[stop], **greedy(16))
    assert got.choices[0].text == want["text"][: want["text"].index(stop)]
    assert got.choices[0].finish_reason == "stop"
    # /metrics counts it a stop, not an abort (this process ended it in the engine)
    deadline = time.monotonic() + 30
    while _finished_by_reason(server) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    after = _finished_by_reason(server)
    assert after.get("stop", 0) == before.get("stop", 0) + 1
    assert after.get("abort", 0) == before.get("abort", 0), (before, after)
    (long,) = reference([PROMPTS[4]], 400)
    body = dict(model=MODEL, prompt=PROMPTS[4], stop=[stop], logprobs=0, **greedy(400))
    # up to the token whose text reached the stop string, not the 400 asked for
    reached = next(i for i in range(1, 401) if stop in wb.llm.decode(long["token_ids"][:i]))
    for stream in (False, True):
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        answer = client.completions.create(stream=stream, **usage, **body)
        if stream:
            chunks = list(answer)
            choices, counted = [c.choices[0] for c in chunks if c.choices], chunks[-1].usage
        else:
            choices, counted = answer.choices, answer.usage
        ids = [t for c in choices for t in c.model_extra["token_ids"]]
        assert "".join(c.text for c in choices) == long["text"][: long["text"].index(stop)]
        assert ids == long["token_ids"][:reached]
        assert sum(len(c.logprobs.tokens) for c in choices) == reached
        assert counted.completion_tokens == reached
    deadline = time.monotonic() + 30
    while server.loop.live and time.monotonic() < deadline:
        time.sleep(0.02)
    done = wb.history.requests.tail(2)
    assert (done.completion_tokens < 400).all(), done
    wb.pause()  # between steps: every stopped request let go of what it held
    try:
        wb.check_integrity()
    finally:
        wb.resume()


def test_a_client_that_leaves_mid_stream_is_aborted_and_freed(served):
    wb, server, client = served
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[3],
        stream=True,
        max_tokens=400,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()  # the connection goes
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        requests = wb.history.requests
        if (requests.finish_reason == "abort").any():
            break
        time.sleep(0.05)
    aborted = wb.history.requests.query("finish_reason == 'abort'")
    assert len(aborted) >= 1 and (aborted.completion_tokens < 400).all()
    wb.pause()
    try:
        wb.check_integrity()  # nothing leaked: its slot and KV pages are back
    finally:
        wb.resume()


def test_a_client_that_leaves_a_stream_of_n_choices_aborts_them_all(served):
    wb, server, client = served
    before = int((wb.history.requests.finish_reason == "abort").sum())
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[2],
        n=3,
        stream=True,
        max_tokens=400,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    seen = set()
    for chunk in stream:
        seen.update(c.index for c in chunk.choices)
        if len(seen) == 3:
            break
    stream.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        requests = wb.history.requests
        if (requests.finish_reason == "abort").sum() >= before + 3:
            break
        time.sleep(0.05)
    aborted = wb.history.requests.query("finish_reason == 'abort'")
    assert len(aborted) == before + 3 and (aborted.completion_tokens < 400).all()
    wb.pause()
    try:
        wb.check_integrity()
    finally:
        wb.resume()


BAD = [
    ({"model": MODEL}, "prompt"),
    ({"model": MODEL, "prompt": ""}, "prompt"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": "8"}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 10**6}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "temperature": -1}, "temperature"),
    ({"model": MODEL, "prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"model": MODEL, "prompt": "hi", "top_k": "all"}, "top_k"),
    ({"model": MODEL, "prompt": "hi", "seed": -3}, "seed"),
    ({"model": MODEL, "prompt": "hi", "n": 0}, "n"),
    ({"model": MODEL, "prompt": "hi", "n": "2"}, "n"),
    ({"model": MODEL, "prompt": "hi", "n": 129}, "n"),
    ({"model": MODEL, "prompt": "hi", "best_of": 2}, "best_of"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"model": MODEL, "prompt": "hi", "echo": "yes"}, "echo"),
    ({"model": MODEL, "prompt": "hi", "suffix": "!"}, "suffix"),
    ({"model": MODEL, "prompt": "hi", "min_tokens": 4}, "min_tokens"),
    ({"model": MODEL, "prompt": "hi", "stream": "yes"}, "stream"),
    ({"model": MODEL, "prompt": "hi", "stop": [""]}, "stop"),
    ({"model": MODEL, "prompt": "hi", "frobnicate": True}, "frobnicate"),
    ({"model": "gpt-4", "prompt": "hi"}, "model"),
    ({"model": MODEL, "prompt": [1, 2, 10**9]}, "prompt"),
    ({"model": MODEL, "prompt": ["a", [1, "b"]]}, "prompt"),
    ({"model": MODEL, "prompt": ["a", ""]}, "prompt"),
    ({"model": MODEL, "prompt": [[1, 2], []]}, "prompt"),
    ({"model": MODEL, "prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias"),
    ({"model": MODEL, "prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"model": MODEL, "prompt": "hi", "logit_bias": {"5": "up"}}, "logit_bias"),
    ({"model": MODEL, "prompt": "hi", "logit_bias": {"-2": 1}}, "logit_bias"),
    ({"model": MODEL, "prompt": "hi", "logit_bias": {str(2**40): 1}}, "logit_bias"),
    ({"model": MODEL, "prompt": "hi", "logit_bias": [5]}, "logit_bias"),
    ({"model": MODEL, "prompt": "hi", "presence_penalty": 3}, "presence_penalty"),
    ({"model": MODEL, "prompt": "hi", "frequency_penalty": "high"}, "frequency_penalty"),
    ({"model": MODEL, "prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"model": MODEL, "prompt": "hi", "max_completion_tokens": 4}, "max_completion_tokens"),
    ({"model": MODEL, "prompt": "hi", "store": False}, "store"),  # a chat field only
    ({"model": MODEL, "prompt": "hi", "user": 5}, "user"),  # (accepted, unused: but a string)
    ({"model": MODEL, "prompt": "hi", "metadata": [1, 2]}, "metadata"),
]
HI = [{"role": "user", "content": "hi"}]
BAD_CHAT = [
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [{}]}, "tools"),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
        "top_logprobs",
    ),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": 2}, "logprobs"),
    # OpenAI's chat fields that ask for what this server does not do: refused by name
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "store": True}, "store"),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "service_tier": "flex"},
        "service_tier",
    ),
    (
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "modalities": ["audio"]},
        "modalities",
    ),
    ({"model": MODEL, "messages": HI, "reasoning_effort": "low"}, "reasoning_effort"),
    # completions has no max_completion_tokens in OpenAI's API
]


@pytest.mark.parametrize(
    "path, body, field",
    [
        *[("/completions", b, f) for b, f in BAD],
        *[("/chat/completions", b, f) for b, f in BAD_CHAT],
    ],
)
def test_a_bad_request_is_a_400_naming_the_field_and_the_server_serves_on(
    served, path, body, field
):
    wb, server, client = served
    reply = httpx.post(server.url + path, json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and error["type"] == "invalid_request_error"
    assert field.split(".")[-1].split("[")[0] in error["message"]
    ok = client.completions.create(model=MODEL, prompt="Hello", **greedy(2))
    assert ok.choices[0].finish_reason == "length"


def test_a_prompt_longer_than_the_context_is_blamed_not_max_tokens_left_unsent(served):
    """A prompt the context cannot hold is the prompt's (or the messages') fault, not that of
    a max_tokens the client never sent; a text no context could hold is refused by its length,
    before the tokenizer spends seconds on it (tokenizing runs off the event loop either way)."""
    wb, server, client = served
    context = wb.llm.engine.max_seq_len
    cases = [
        ("/completions", {"prompt": [5] * (context + 3)}, "prompt", "leaving no room"),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": " hi" * (context + 3)}]},
            "messages",
            "the messages come to",
        ),
        ("/completions", {"prompt": "word " * 3_000_000}, "prompt", "15,000,000 characters"),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": "word " * 3_000_000}]},
            "messages",
            "15,000,000 characters",
        ),
    ]
    for path, body, field, said in cases:
        reply = httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=120)
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == field, error
        assert said in error["message"] and "max_tokens" not in error["message"], error
    sent = {"prompt": [5] * (context - 2), "max_tokens": 10}  # the prompt fits; max_tokens not
    error = httpx.post(server.url + "/completions", json={"model": MODEL, **sent}).json()["error"]
    assert error["param"] == "max_tokens", error
    ok = client.completions.create(model=MODEL, prompt="Hello", **greedy(2))
    assert ok.choices[0].finish_reason == "length"


def test_openai_chat_fields_that_ask_for_nothing_are_accepted(served):
    """What the `openai` client sends with its defaults spelled out (no storing, the default
    tier, text out, no tool call) is served; a refusal says what the server does instead."""
    wb, server, client = served
    said = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        store=False,
        service_tier="auto",
        modalities=["text"],
        tool_choice="none",
        parallel_tool_calls=False,
        **greedy(3),
    )
    assert said.choices[0].finish_reason == "length" and said.usage.completion_tokens == 3
    refused = httpx.post(
        server.url + "/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "store": True},
        timeout=30,
    ).json()["error"]["message"]
    expected = "store=True is not supported by this server (it stores nothing); leave store out"
    assert refused == expected


def test_malformed_and_huge_bodies_are_refused_and_the_pool_stays_whole(served):
    wb, server, client = served
    # a path or method not served: OpenAI's error shape too, as the openai client reads it
    for method, path, status in (("POST", "/embeddings", 404), ("GET", "/completions", 405)):
        reply = httpx.request(method, server.url + path, timeout=30)
        error = reply.json()["error"]
        assert reply.status_code == status and error["code"] in ("not_found", "method_not_allowed")
        assert path in error["message"] and error["type"] == "invalid_request_error", error
    with pytest.raises(openai.NotFoundError, match="/v1/completions"):
        client.embeddings.create(model=MODEL, input="hi")
    bad = httpx.post(server.url + "/completions", content=b"{not json", timeout=30)
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    huge = httpx.post(server.url + "/completions", content=b" " * (17 * 2**20), timeout=60)
    assert huge.status_code == 413
    assert (
        client.completions.create(model=MODEL, prompt="Hi", **greedy(2)).usage.completion_tokens
        == 2
    )
    wb.pause()
    try:
        wb.check_integrity()
    finally:
        wb.resume()


def test_the_engine_steps_on_while_the_http_process_reads_nothing(served):
    """The HTTP process stopped (SIGSTOP) with requests in flight: the engine's thread steps
    them to their end, its messages waiting in its outbox past the socket's buffer (made small
    here); once the process goes on, every client gets every token, as `generate` gives them."""
    wb, server, client = served
    expected = reference(PROMPTS[:4], 120)
    sock = server._channel._sock
    buffer = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    answers: list = [None] * 4

    def ask(i: int) -> None:
        answers[i] = client.completions.create(model=MODEL, prompt=PROMPTS[i], **greedy(120))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    try:
        with server.loop.lock:  # all four are in the engine before the HTTP process stops
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 30
            while len(server.loop._uid_of) < 4 and time.monotonic() < deadline:
                server.loop.drain()
                time.sleep(0.01)
            os.kill(server._process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while server.loop.live and time.monotonic() < deadline:
            time.sleep(0.02)
        ended_while_stopped = not server.loop.live
    finally:
        os.kill(server._process.pid, signal.SIGCONT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
    for thread in threads:
        thread.join(60)
    assert ended_while_stopped
    assert server.loop.times.backlog_max > 8192  # more than the socket held
    for answer, want in zip(answers, expected):
        assert answer.choices[0].model_extra["token_ids"] == want["token_ids"]
    wb.check_integrity()


def test_pause_then_step_by_hand_then_resume_with_a_client_waiting(served):
    wb, server, client = served
    wb.pause()
    answers = []
    thread = threading.Thread(
        target=lambda: answers.append(
            client.completions.create(model=MODEL, prompt=PROMPTS[1], **greedy(6))
        )
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not server.loop.queue_len and time.monotonic() < deadline:  # it reached the engine
        time.sleep(0.02)
    assert server.loop.queue_len == 1 and not answers  # waiting: the engine does not step
    record = wb.step()  # by hand: its prompt
    assert record.phase == "prefill" and record.size == 1
    uid = record.rows[0].uid
    assert wb.history.requests.set_index("uid").loc[uid, "source"] == "http"
    wb.step()
    time.sleep(0.2)
    assert not answers  # still waiting: 6 tokens asked for
    wb.resume()
    thread.join(timeout=60)
    (answer,) = answers
    assert answer.choices[0].model_extra["token_ids"] == reference([PROMPTS[1]], 6)[0]["token_ids"]
    with pytest.raises(RuntimeError, match="pause"):
        wb.step()  # not while it steps by itself


def test_metrics_are_prometheus_text_with_the_engines_own_facts(served):
    from prometheus_client.parser import text_string_to_metric_families

    wb, server, client = served
    client.completions.create(model=MODEL, prompt=PROMPTS[2], **greedy(4))
    text = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "workbench_requests_running",
        "workbench_requests_waiting",
        "workbench_kv_pages_in_use",
        "workbench_prefix_cache_hit_tokens",
        "workbench_admission_refusals",
        "workbench_time_to_first_token_seconds",
        "workbench_inter_token_latency_seconds",
        "workbench_step_seconds",
        "workbench_step_delivery_seconds",
    ):
        assert name in families, sorted(families)
    value = {s.name: s.value for f in families.values() for s in f.samples if not s.labels}
    assert value["workbench_time_to_first_token_seconds_count"] >= 1
    # every step's message delivered (at least the request's 4), each after it was sent
    delivered = value["workbench_step_delivery_seconds_count"]
    assert delivered >= value["workbench_step_seconds_count"] >= 4
    assert 0 < value["workbench_step_delivery_seconds_sum"] < delivered
    assert value["workbench_generation_tokens_total"] >= 4
    finished = {
        s.labels["reason"]: s.value
        for s in families["workbench_requests_finished"].samples
        if s.name.endswith("_total")
    }
    assert finished["length"] >= 1
    assert (
        httpx.get(server.url.removesuffix("/v1") + "/health", timeout=30).json()["status"] == "ok"
    )
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_the_engines_thread_says_where_its_time_went_while_serving(served):
    """`server.loop.times`: the thread's steps, its time in them, reading the HTTP process's
    requests and sending it tokens (where a step waiting on the HTTP side would show), and idle
    time while there is nothing to step."""
    wb, server, client = served
    time.sleep(0.2)
    before, steps_before = dataclasses.replace(server.loop.times), len(wb.history)
    started = time.perf_counter()
    for prompt in PROMPTS[:3]:
        stream = client.completions.create(model=MODEL, prompt=prompt, stream=True, **greedy(8))
        assert sum(1 for _ in stream) >= 1
    busy = time.perf_counter() - started
    time.sleep(0.5)  # nothing queued or running: the thread waits, and says so
    after, wall = dataclasses.replace(server.loop.times), time.perf_counter() - started
    steps = len(wb.history) - steps_before
    assert steps >= 3 * 8  # one request after another: a step per token
    turns = after.turns - before.turns  # (and the turns that found nothing to do)
    assert after.steps - before.steps == steps and turns >= steps
    stepping, read, send, idle = (
        getattr(after, f) - getattr(before, f) for f in ("stepping_s", "read_s", "send_s", "idle_s")
    )
    assert stepping > 0 and read > 0 and send > 0
    assert after.exchange_max_s >= (read + send) / turns
    assert idle >= 0.4 and stepping + read + send <= busy
    # (a wait is counted when it ends: one under way at `before` adds up to its 50 ms, the
    # timeout of the thread's waits in `ServeLoop._run`, from before `started`)
    assert stepping + read + send + idle <= wall + 0.05
    assert "steps in" in str(after) and "idle with nothing to step" in str(after)


def test_a_full_queue_is_a_503_and_stopping_ends_what_is_in_flight():
    llm = LLM(MODEL, max_running_reqs=1, max_extend_tokens=64)
    server = llm.serve(port=0, max_queued_requests=1)
    url, port = server.url, server.port
    server.pause()
    replies: list = []

    def send() -> None:
        try:
            replies.append(
                httpx.post(url + "/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=60)
            )
        except httpx.HTTPError as exc:
            replies.append(exc)

    first = threading.Thread(target=send)
    first.start()
    deadline = time.monotonic() + 30
    while server.loop.queue_len < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    full = httpx.post(url + "/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=30)
    assert full.status_code == 503 and full.headers["retry-after"] == "1"
    assert "max-queued-requests" in full.json()["error"]["message"]
    # more choices than the server ever queues: a 400, not a 503 to retry
    many = httpx.post(url + "/completions", json={"prompt": "Hi", "n": 2}, timeout=30)
    assert many.status_code == 400 and many.json()["error"]["param"] == "n"
    assert "max-queued-requests 1" in many.json()["error"]["message"]
    llm.stop_serving()  # the one waiting gets a clean end
    first.join(timeout=30)
    (reply,) = replies
    assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] == "abort"
    assert _free(port)  # the port is free again
    llm.check_integrity()
    assert llm.generate(["Hi"], SamplingParams(max_tokens=2))[0]["completion_tokens"] == 2
    llm.close()


def test_the_server_as_a_process_answers_and_stops_on_ctrl_c():
    # (a process that does not stop writes every thread's stack, both processes', on SIGABRT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    # NOTE: a child inherits an ignored SIGINT (Python then leaves it ignored, as in a shell's
    # background job) and a blocked one: so the server starts with Ctrl-C's default, whatever
    # this test process was left with (a probe saw neither at the two unexplained failures' test
    # in passing runs: this rules those out, it is not known to be their cause)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workbench",
                "serve",
                "--model",
                MODEL,
                "--port",
                "0",
                "--max-num-seqs",
                "4",
                "--served-model-name",
                "tiny",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    finally:  # (None: a handler set outside Python, which cannot be put back)
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        url = None
        for line in proc.stdout:
            if " at http://" in line:
                url = line.split(" at ")[-1].strip()
                break
        assert url, "the server did not say where it listens"
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        answer = client.completions.create(model="tiny", prompt="Hello", **greedy(3))
        assert answer.usage.completion_tokens == 3 and answer.model == "tiny"
        rest: list[str] = []
        reader = threading.Thread(target=lambda: rest.extend(proc.stdout), daemon=True)
        reader.start()
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            front = subprocess.run(
                ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
            ).stdout.split()
            for pid in [*map(int, front), proc.pid]:  # one at a time: their stacks apart
                os.kill(pid, signal.SIGABRT)
                time.sleep(1)
            proc.wait(timeout=30)
            reader.join(10)
            pytest.fail("the server did not stop in 60 s after Ctrl-C:\n" + "".join(rest)[-20000:])
        assert code == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_terminal_chat_streams_answers_and_shows_their_steps():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "workbench", "chat", "--model", MODEL, "--max-tokens", "6"],
        input="Hello there\n/steps\nAnd again\n/exit\n",
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "(steps shown)" in out
    steps = [line for line in out.splitlines() if line.strip().startswith("step ")]
    assert steps and "prefill" in steps[0] and all(" ms" in s for s in steps)
    assert 1 <= len(steps) <= 6  # the second answer's: its prompt, then up to five decodes


@pytest.mark.slow  # ~17 s of load; a client leaving mid-stream stays in make test
def test_hundreds_of_streams_some_leaving_leave_the_engine_serving_and_the_pool_whole(served):
    """300 streams at once, every third closed after its first event: the others get their
    answers, the engine serves on, nothing leaks."""
    import asyncio

    wb, server, client = served

    async def one(http, i: int) -> int:
        body = {
            "model": MODEL,
            "prompt": PROMPTS[i % 5],
            "max_tokens": 6,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with http.stream("POST", "/completions", json=body) as reply:
            async for line in reply.aiter_lines():
                if i % 3 == 0 and line.startswith("data: {"):
                    return -1  # leaves mid-stream
                if '"usage"' in line:
                    return json.loads(line[6:])["usage"]["completion_tokens"]
        return 0

    async def all_of_them() -> list[int]:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=300) as http:
            return await asyncio.gather(*(one(http, i) for i in range(300)))

    counts = asyncio.run(all_of_them())
    assert counts.count(-1) == 100 and counts.count(6) == 200
    deadline = time.monotonic() + 60
    while wb.server.loop.live and time.monotonic() < deadline:
        time.sleep(0.05)  # the ones that left are aborted; the rest have ended
    wb.check_integrity()
    assert (
        client.completions.create(model=MODEL, prompt="Hi", **greedy(2)).usage.completion_tokens
        == 2
    )


def test_a_streamed_chunk_written_from_its_template_is_the_json_of_its_fields():
    from transformers import AutoTokenizer

    from workbench.models import resolve
    from workbench.serve.app import _chunk, _Events
    from workbench.serve.output import Decoder, Delta, Output
    from workbench.serve.protocol import Parsed

    for chat, ids, index in ((False, False, 0), (True, True, 2)):
        parsed = Parsed(
            chat,
            [1, 2],
            SamplingParams(max_tokens=3),
            stream=True,
            return_token_ids=ids,
            model='m"odel',
        )
        output = Output.__new__(Output)
        output.parsed, output.id, output.created, output.error = parsed, "cmpl-x", 17, None
        output.index = index  # (the choice's, of `n`)
        output._decoder = Decoder(AutoTokenizer.from_pretrained(resolve(MODEL)), 10**6)
        asked = Delta("é", [5, 6], None, [(-0.5, [(5, -0.5), (9, -1.5)]), (-2.0, [])], 7)
        for delta in (Delta('a "quoted"\nline é', [5, 6], None), Delta("", [], "length"), asked):
            written = json.loads(_Events(output).chunk(delta).removeprefix("data: "))
            assert written == _chunk(None, output, delta)


def test_a_step_that_fails_while_serving_ends_its_request_with_a_500_and_serves_on(served):
    """The engine's forward raises once: the request in that step is answered 500 with what
    failed, its slot and pages are freed, and the next request is served."""
    wb, server, client = served
    forward, failed = wb.engine.forward, []

    def once(*args, **kwargs):
        if not failed:
            failed.append(True)
            raise RuntimeError("an injected fault")
        return forward(*args, **kwargs)

    wb.engine.forward = once
    try:
        reply = httpx.post(
            server.url + "/completions",
            json={"model": MODEL, "prompt": "Hello", "max_tokens": 4},
            timeout=60,
        )
    finally:
        wb.engine.forward = forward
    assert reply.status_code == 500 and "injected fault" in reply.json()["error"]["message"]
    wb.check_integrity()
    assert (
        client.completions.create(model=MODEL, prompt="Hi", **greedy(2)).usage.completion_tokens
        == 2
    )


@pytest.mark.slow  # ~14 s
def test_requests_sent_while_the_engine_is_in_a_long_step_all_reach_it():
    """The HTTP process sends requests faster than the engine reads them (one long step, as an
    8B model's prefill is): more bytes than the pipe holds wait in the HTTP process, nothing is
    lost or torn, the event loop serves on, and every request is answered."""
    import random

    wb = Workbench(MODEL, max_running_reqs=32, max_extend_tokens=4096)
    try:
        server = wb.serve(port=0)
        rng = random.Random(0)
        prompt = [rng.randrange(300, 49_000) for _ in range(4000)]
        prompts = [prompt] * 24  # (one prefill: the others hit the prefix cache)
        replies: list = [None] * len(prompts)

        def send(i: int) -> None:
            body = {"model": MODEL, "prompt": prompts[i], "max_tokens": 2, "ignore_eos": True}
            replies[i] = httpx.post(server.url + "/completions", json=body, timeout=120)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(prompts))]
        with server.loop.lock:  # the engine's thread is held, as in a step that takes seconds
            for thread in threads:
                thread.start()
            time.sleep(1.5)  # ~290 KB of token ids: more than a socket's buffer
            models = httpx.get(server.url + "/models", timeout=5)  # the loop is not blocked
        for thread in threads:
            thread.join(120)
        assert models.status_code == 200
        assert [r.status_code for r in replies] == [200] * len(prompts)
        assert all(r.json()["usage"]["prompt_tokens"] == 4000 for r in replies)
        wb.check_integrity()
    finally:
        wb.close()


def test_the_http_processs_command_line_holds_no_key(served):
    """The engine's listener key reaches the HTTP process on its stdin: any user's `ps` reads a
    command line (/proc/PID/cmdline), and with the key could send the engine requests."""
    _, server, client = served
    cmdline = Path(f"/proc/{server._process.pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[-3:] == [b"-m", b"workbench.serve.front", b""], cmdline
    assert client.models.list().data[0].id == server.name  # and it serves
