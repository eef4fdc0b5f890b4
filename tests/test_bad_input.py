"""Bad input: a ValueError naming the problem, raised before any resource is taken; the same
LLM keeps working afterwards."""

from __future__ import annotations

import pytest

from workbench import LLM, SamplingParams
from workbench.config import EngineConfig

from .conftest import greedy, hf_greedy, run


@pytest.fixture(scope="module")
def llm() -> LLM:
    # a short context and a small pool, so both limits are easy to cross
    return LLM("tiny-llama", max_seq_len=64, num_pages=40, max_running_reqs=4)


def state(llm: LLM) -> tuple:
    """Everything a request could take: queue, running set, slots, free and cached KV."""
    sched = llm.scheduler
    cache = sched.cache
    return (
        len(sched.prefill.queue),
        len(sched.decode.running),
        sched.table.available_size,
        cache.free_size,
        cache.prefix_cache.size,
        cache.in_use_size,
    )


def assert_still_serves(llm: LLM) -> None:
    prompt = llm.encode("The capital of France is")
    outputs, _ = run(llm, [prompt], greedy(5))
    assert outputs[0]["token_ids"] == hf_greedy("tiny-llama", [prompt], 5)[0]


@pytest.mark.parametrize(
    ("prompts", "sampling", "message"),
    [
        ([""], None, "prompt 0 is empty"),
        ([[]], None, "prompt 0 is empty"),
        (["fine", ""], None, "prompt 1 is empty"),
        ([list(range(60))], greedy(10), "longer than the context of 64"),
        ([list(range(30))], greedy(20), "more than the KV pool can ever hold"),
        ([[1, 2, -1]], None, "outside the vocabulary"),
        ([[1, 49152]], None, "outside the vocabulary"),
        (["a", "b"], [greedy(2)], "2 prompts but 1 sampling params"),
        (["a"], {"max_tokens": 3}, "must be a SamplingParams"),
    ],
)
def test_bad_request_is_refused_before_taking_anything(llm, prompts, sampling, message):
    before = state(llm)
    with pytest.raises(ValueError, match=message):
        llm.generate(prompts, sampling)
    assert state(llm) == before
    llm.check_integrity()
    assert_still_serves(llm)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
        (dict(max_tokens=-3), "max_tokens"),
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k must be -1"),
    ],
)
def test_bad_sampling_values(llm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
    assert_still_serves(llm)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(page_size=3), "page_size must be a power of two"),
        (dict(page_size=0), "page_size must be a power of two"),
        (dict(max_extend_tokens=0), "max_extend_tokens"),
        (dict(cache="lru"), "cache must be one of"),
        (dict(dtype="float7"), "unknown dtype"),
        (dict(policy="shortest_first"), "policy must be one of .*mixed"),
    ],
)
def test_bad_engine_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM("tiny-llama", **kwargs)


def test_unknown_model_names_the_choices():
    with pytest.raises(ValueError, match="unknown model 'no-such-model'.*smollm2"):
        LLM("no-such-model")
    with pytest.raises(ValueError, match="unknown model 'dummy:gpt-17'"):
        LLM("dummy:gpt-17")


def test_bad_engine_options_fail_before_loading_a_model(monkeypatch):
    """EngineConfig checks its knobs on construction, so nothing heavy has started."""
    with pytest.raises(ValueError, match="power of two"):
        EngineConfig(model="smollm2", page_size=6)
