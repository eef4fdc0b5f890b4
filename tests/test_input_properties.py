"""Property test: constructor settings and sampling values drawn from wide strategies, valid and
not. Either a TypeError or ValueError comes before anything is taken, or the run is right:
Hugging Face's greedy tokens (for greedy settings with no bias or penalty), the promised lengths
otherwise, and a KV pool whose accounting holds. Never a crash inside a step. `make test` draws a
quick sample; the slow profile (`pytest -m slow`) draws ten times as many."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from workbench import LLM, SamplingParams

from .conftest import PROMPTS, hf_greedy

# each setting: values that are allowed, and values that are not (or of the wrong kind)
ENGINE = {
    "page_size": (st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([3, 0, -4, 16.0, "4"])),
    "max_extend_tokens": (
        st.one_of(st.integers(1, 40), st.just(8192)),
        st.sampled_from([0, -2, 1.5, True]),
    ),
    "cache": (st.sampled_from(["radix", "naive"]), st.sampled_from(["lru", None, 3])),
    "policy": (
        st.sampled_from(["prefill_first", "decode_first", "mixed"]),
        st.sampled_from(["fifo", None]),
    ),
    "max_running_reqs": (st.integers(1, 6), st.sampled_from([0, -1, 2.0, True])),
    "num_pages": (st.one_of(st.none(), st.integers(1, 300)), st.sampled_from([0, -1, 64.0, "8"])),
    "max_seq_len": (st.one_of(st.none(), st.integers(1, 160)), st.sampled_from([0, -5, 99.0])),
    "overlap": (st.sampled_from([None, True, False]), st.sampled_from(["no", 1, 0.0])),
    "share_threshold": (st.integers(0, 40), st.sampled_from([-1, -3, 4.5])),
    "kv_memory_gb": (
        st.sampled_from([0.01, 0.001]),
        st.sampled_from([0.0, -1.0, float("inf"), "1"]),
    ),
    "seed": (st.integers(0, 5), st.sampled_from([-1, 1.5, None, "0"])),
    "dtype": (st.sampled_from([None, "float32", "fp32"]), st.sampled_from(["float7", 32, "int8"])),
    "record": (st.sampled_from(["off", "light", "full"]), st.sampled_from(["all", None, 1])),
    "padded_steps": (st.booleans(), st.sampled_from(["yes", 1, None])),
}
SAMPLING = {
    "max_tokens": (st.integers(1, 10), st.sampled_from([0, -1, True, 2.0, "3"])),
    "temperature": (
        st.one_of(st.just(0.0), st.floats(1e-5, 3.0)),
        st.sampled_from([-0.5, 1e-300, 1e-6, float("inf"), float("nan"), "0.7", None]),
    ),
    "top_k": (st.sampled_from([-1, 1, 5, 10**6]), st.sampled_from([0, -7, 10**20, 2.0])),
    "top_p": (st.floats(0.01, 1.0), st.sampled_from([0.0, -0.5, 1.5, float("nan"), "1"])),
    "ignore_eos": (st.booleans(), st.sampled_from(["no", 0, None])),
    "seed": (
        st.one_of(st.none(), st.integers(0, 2**63 - 1)),
        st.sampled_from([-2, 2**64, 1.5, "a"]),
    ),
    "logprobs": (
        st.one_of(st.none(), st.integers(0, 20)),
        st.sampled_from([-1, 21, True, 2.0, "3"]),
    ),
    "prompt_logprobs": (
        st.one_of(st.none(), st.integers(0, 20)),
        st.sampled_from([-1, 21, False, 1.0, "3"]),
    ),
    "presence_penalty": (
        st.floats(-2.0, 2.0),
        st.sampled_from([2.5, -3.0, float("nan"), float("inf"), "0.5", None]),
    ),
    "frequency_penalty": (st.floats(-2.0, 2.0), st.sampled_from([-2.01, 9.0, float("nan"), True])),
    "repetition_penalty": (
        st.floats(0.1, 100.0),
        st.sampled_from([0.0, -1.0, 100.5, float("nan"), float("inf"), "1.2"]),
    ),
    # (a token past the vocabulary is the request's to refuse: the model's, not the params')
    "logit_bias": (
        st.one_of(
            st.none(),
            st.dictionaries(st.integers(0, 49151), st.floats(-100.0, 100.0), max_size=3),
        ),
        st.sampled_from(
            [{-1: 1.0}, {5: 100.5}, {5: float("nan")}, {"a": 1.0}, [1, 2], {49152: 1.0}]
            + [{True: 1.0}, {5: "1"}, 3]
        ),
    ),
}
PROMPT = (
    st.one_of(st.sampled_from(PROMPTS), st.lists(st.integers(0, 49151), min_size=1, max_size=40)),
    st.one_of(
        st.sampled_from(["", None, b"x", {1, 2}, [], "a\ud800"]),
        st.lists(st.integers(-2, 60000), min_size=1, max_size=5),
        st.lists(st.booleans(), min_size=1, max_size=3),
    ),
)


def draw_settings(data, table: dict, valid: bool) -> dict:
    """Some of the keys; when not `valid`, each present key is bad with probability 1/3."""
    out = {}
    for key, (good, bad) in table.items():
        if data.draw(st.booleans(), label=f"set {key}"):
            out[key] = data.draw(good if valid else st.one_of(good, good, bad), label=key)
    return out


def draw_case(data) -> tuple[dict, dict, list]:
    valid = data.draw(st.booleans(), label="all valid")
    good, bad = PROMPT
    prompt = good if valid else st.one_of(good, good, good, bad)
    prompts = data.draw(st.lists(prompt, min_size=1, max_size=4), label="prompts")
    return draw_settings(data, ENGINE, valid), draw_settings(data, SAMPLING, valid), prompts


def check(engine: dict, sampling: dict, prompts: list) -> None:
    engine = {"kv_memory_gb": 0.01, **engine}  # a small pool unless drawn otherwise
    try:
        llm = LLM("tiny-llama", **engine)
    except (TypeError, ValueError):
        event("refused: engine settings")  # before anything was built
        return
    try:
        params = SamplingParams(**sampling)
    except (TypeError, ValueError):
        event("refused: sampling")
        return
    sched = llm.scheduler
    before = (sched.cache.free_size, sched.table.available_size, len(sched.prefill.queue))
    try:
        outputs = llm.generate(prompts, params)
    except (TypeError, ValueError):
        assert (sched.cache.free_size, sched.table.available_size, len(sched.prefill.queue)) == (
            before
        ), "a refused request took something"
        llm.check_integrity()
        event("refused: request")
        return
    llm.check_integrity()
    assert sched.is_idle
    # greedy on the model's own logits: Hugging Face's tokens, each its likeliest
    plain = params.is_greedy and not params.adjusts_logits
    for out in outputs:
        assert 1 <= out["completion_tokens"] <= params.max_tokens
        assert out["finish_reason"] in ("stop", "length")
        if params.logprobs is None:
            assert out["logprobs"] is None
        else:  # one entry a token: a log probability, and as many of the likeliest as asked
            assert len(out["logprobs"]) == out["completion_tokens"]
            for logprob, top in out["logprobs"]:
                assert logprob <= 0.0 and len(top) == params.logprobs
                if top:  # no token is likelier than the likeliest; greedy's is it
                    assert logprob <= top[0][1] + 1e-6
                    assert not plain or logprob == top[0][1]
    for out in outputs:
        if params.prompt_logprobs is None:
            assert out["prompt_logprobs"] is None
        else:  # the first token none, then one entry a token, as many of the likeliest as asked
            entries = out["prompt_logprobs"]
            assert len(entries) == out["prompt_tokens"] and entries[0] is None
            for logprob, top in entries[1:]:
                assert logprob <= 0.0 and len(top) == params.prompt_logprobs
                assert not top or logprob <= top[0][1] + 1e-6
    event("served, greedy" if plain else "served, sampled, biased or penalized")
    if plain:
        ids = [llm.encode(p) for p in prompts]
        expected = hf_greedy("tiny-llama", ids, params.max_tokens, ignore_eos=params.ignore_eos)
        assert [o["token_ids"] for o in outputs] == expected
    else:
        assert all(math.isfinite(t) for o in outputs for t in o["token_ids"])


COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=24, derandomize=True, **COMMON)  # (400 under -m slow, below)
@given(data=st.data())
@pytest.mark.slow  # ~18 s of hypothesis examples; the bad-input tables stay in make test
def test_settings_either_refused_up_front_or_served_right(data):
    check(*draw_case(data))


@pytest.mark.slow
@settings(max_examples=400, **COMMON)
@given(data=st.data())
def test_settings_either_refused_up_front_or_served_right_long(data):
    check(*draw_case(data))
