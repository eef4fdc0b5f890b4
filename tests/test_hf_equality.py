"""Greedy output equals Hugging Face `generate` token for token in float32, for every setting."""

from __future__ import annotations

import pytest
import torch

from workbench import LLM, SamplingParams

from .conftest import PROMPTS, greedy, hf_greedy, run, shared
from .planted import eos_prompts, planted_in_transformers


def _settings():
    """Every model x page size x token budget x cache; SmolLM2 under chunked budgets (1, 3, 16
    tokens: 10-25 s each on the CPU) only with `-m slow`, the tiny models covering those budgets
    in `make test` and SmolLM2 running whole prompts there, at page size 1 without the cache
    and 4 with it (the other two with `-m slow`)."""
    for model in ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "smollm2"):
        for page_size in (1, 4):
            for budget in (1, 3, 16, 8192):
                for cache in ("naive", "radix"):
                    whole = (page_size, cache) in ((1, "naive"), (4, "radix"))
                    slow = model == "smollm2" and (budget < 8192 or not whole)
                    marks = [pytest.mark.slow] if slow else []
                    yield pytest.param(model, page_size, budget, cache, marks=marks)


@pytest.mark.parametrize("model, page_size, max_extend_tokens, cache", list(_settings()))
def test_greedy_matches_hf(model, page_size, max_extend_tokens, cache):
    """Prompts of different lengths in one batch, two of them sharing a prefix; with the radix
    cache the same prompts run a second time, now served mostly from the cache. One engine per
    model and page size; the token budget and the cache are the scheduler's (`reconfigure`)."""
    max_new = 10 if model == "smollm2" else 16
    llm = shared(lambda: LLM(model, page_size=page_size, max_running_reqs=8), model, page_size)
    llm.reconfigure(max_extend_tokens=max_extend_tokens, cache=cache)
    ids = [llm.encode(p) for p in PROMPTS]
    ids += [ids[3] + llm.encode(" and came back"), ids[3][:-2] + llm.encode(" at noon")]
    expected = hf_greedy(model, ids, max_new)
    for _ in range(2 if cache == "radix" else 1):
        outputs, _ = run(llm, ids, greedy(max_new))
        assert [o["token_ids"] for o in outputs] == expected
    if cache == "radix":
        assert all(
            o["cached_tokens"] >= (o["prompt_tokens"] - 1) // page_size * page_size for o in outputs
        )


def test_eos_stops_like_hf():
    """Without ignore_eos, generation stops at the end-of-sequence token, as HF does, and the
    token is part of the output: the planted model's answers reach EOS 2 to 6 tokens in (one
    runs to its length), in our engine and in transformers with the same weights."""
    llm = LLM("dummy:tiny-induction", max_running_reqs=4)
    eos = llm.engine.model_config.eos_token_ids
    prompts, answers = eos_prompts(eos[0])
    outputs, _ = run(llm, prompts, SamplingParams(max_tokens=16))
    assert [o["token_ids"] for o in outputs] == answers
    assert [o["finish_reason"] for o in outputs] == ["stop"] * 4 + ["length"]
    hf = planted_in_transformers(llm)
    assert hf.generation_config.eos_token_id in (eos[0], eos)  # HF stops on its own config's
    with torch.inference_mode():
        for prompt, out in zip(prompts, outputs):
            ids = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
            assert ids[0, len(prompt) :].tolist() == out["token_ids"]


@pytest.mark.slow  # SmolLM2's chat answers (~11 s); the planted model's EOS stays in make test
def test_eos_stops_like_hf_on_smollm2_chats():
    llm = LLM("smollm2", max_running_reqs=4)
    chats = [
        [{"role": "user", "content": "Write a haiku about the sea."}],
        [{"role": "user", "content": "Say hello."}],
    ]
    texts = [
        llm.tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
        for c in chats
    ]
    prompts = [llm.encode(t) for t in texts]
    outputs, _ = run(llm, prompts, SamplingParams(max_tokens=60))
    refs = hf_greedy("smollm2", prompts, 60, ignore_eos=False)
    assert [o["token_ids"] for o in outputs] == refs
    stopped = [o for o in outputs if o["finish_reason"] == "stop"]
    assert stopped, "expected at least one chat answer to end on EOS within 60 tokens"
    for o in stopped:
        assert o["token_ids"][-1] in llm.engine.model_config.eos_token_ids
        assert o["completion_tokens"] < 60
