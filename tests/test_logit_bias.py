"""`SamplingParams.logit_bias` (OpenAI's `logit_bias`): added to the named tokens' logits before
a token is picked, greedy or sampled, per request; equal to Hugging Face `generate` with the same
single-token `sequence_bias` token for token in float32, for chunked prompts, overlap on and off
and a batch where other requests have none; log probabilities stay the model's own."""

from __future__ import annotations

import functools

import pytest

from workbench import LLM, SamplingParams

from .conftest import CPU_AND_GPU, PROMPTS, hf_generate, hf_greedy, run, shared

MODEL = "smollm2"
MAX_NEW = 8


@functools.cache
def _hf_biased(ids: tuple[int, ...], bias: tuple[tuple[int, float], ...]) -> list[int]:
    sequence_bias = {(token,): value for token, value in bias}
    return hf_generate(MODEL, ids, MAX_NEW, sequence_bias=sequence_bias)


def _biases(llm: LLM, ids: list[list[int]]) -> list[dict[int, float] | None]:
    """Each prompt's bias, chosen to change its greedy answer: its first greedy token banned,
    another token raised a little; the last prompt none (it shares the batch unbiased)."""
    plain = hf_greedy(MODEL, ids, MAX_NEW)
    raised = llm.encode(" the")[0]
    out: list[dict[int, float] | None] = [{p[0]: -100.0, raised: 2.5} for p in plain[:-1]]
    return [*out, None]


@pytest.mark.parametrize(
    "max_extend_tokens, overlap", [(8192, True), (8192, False), (5, True)], ids=str
)
def test_greedy_with_a_bias_equals_hf_sequence_bias(max_extend_tokens, overlap):
    llm = shared(lambda: LLM(MODEL, max_running_reqs=8), MODEL, "bias")
    llm.reconfigure(max_extend_tokens=max_extend_tokens, overlap=overlap)
    ids = [llm.encode(p) for p in PROMPTS[:4]]
    biases = _biases(llm, ids)
    params = [SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, logit_bias=b) for b in biases]
    outputs, _ = run(llm, ids, params)
    expected = [
        _hf_biased(tuple(p), tuple(sorted(b.items()))) if b else hf_greedy(MODEL, [p], MAX_NEW)[0]
        for p, b in zip(ids, biases)
    ]
    assert [o["token_ids"] for o in outputs] == expected
    plain = hf_greedy(MODEL, ids, MAX_NEW)
    # the bias changed every biased answer, and only those
    assert all(o["token_ids"] != p for o, p in zip(outputs[:-1], plain[:-1]))
    assert outputs[-1]["token_ids"] == plain[-1]


def test_a_sampled_request_follows_its_bias_and_reports_the_models_log_probabilities():
    """+100 on a token makes a sampled request (fused race or not, seeded) pick it every time;
    -100 on the greedy choice moves it; the log probability reported for a forced token is the
    model's own (the same as the run without the bias gives that token at the first position)."""
    llm = shared(lambda: LLM(MODEL, max_running_reqs=8), MODEL, "bias")
    llm.reconfigure(max_extend_tokens=8192, overlap=True)
    ids = llm.encode(PROMPTS[0])
    (plain,) = llm.generate([ids], SamplingParams(max_tokens=1, logprobs=20))
    _, top = plain["logprobs"][0]
    forced = top[5][0]  # a likely token, not the most likely
    for extra in ({}, {"top_k": 50}):  # the one-pass race, and the sort for top-k
        sp = SamplingParams(
            max_tokens=6, temperature=1.0, seed=7, logprobs=1, logit_bias={forced: 100}, **extra
        )
        (out,) = llm.generate([ids], sp)
        assert out["token_ids"] == [forced] * 6
        assert out["logprobs"][0][0] == pytest.approx(top[5][1], abs=1e-5)
    banned = SamplingParams(max_tokens=1, logit_bias={top[0][0]: -100})
    (out,) = llm.generate([ids], banned)
    assert out["token_ids"] == [top[1][0]]
    llm.check_integrity()


def test_a_bias_on_a_token_the_model_lacks_is_refused_before_anything_is_queued():
    llm = shared(lambda: LLM(MODEL, max_running_reqs=8), MODEL, "bias")
    vocab = llm.engine.model_config.vocab_size
    ids = llm.encode(PROMPTS[0])
    with pytest.raises(ValueError, match=rf"logit_bias .* names token {vocab}, outside"):
        llm.generate([ids, ids], [SamplingParams(), SamplingParams(logit_bias={vocab: 1.0})])
    assert llm.scheduler.is_idle
    llm.check_integrity()
    for bad, error in (
        ({"a": 1.0}, TypeError),
        ({-1: 1.0}, ValueError),
        ({3: 100.5}, ValueError),
        ({3: float("inf")}, ValueError),
        ([3], TypeError),
    ):
        with pytest.raises(error, match="logit_bias"):
            SamplingParams(logit_bias=bad)
    # the value once, and its kind with its article
    with pytest.raises(TypeError, match=r"a mapping \(a dict\), got \[3\] \(a list\)$"):
        SamplingParams(logit_bias=[3])
    with pytest.raises(TypeError, match=r"got 3 \(an int\)$"):
        SamplingParams(logit_bias=3)
    assert SamplingParams(logit_bias={}).logit_bias is None


RANDOM = {"cpu": "tiny-qwen3", "cuda": "dummy:qwen3-0.6b"}  # random weights: logits not peaked


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_biased_requests_beside_unbiased_ones_where_a_graph_would_sample(device):
    """On the GPU in bfloat16 with CUDA graphs, where a decode step's graph samples unless a
    request in it has a bias: the planted induction model's requests continue their patterns
    beside requests with a small bias (its logits are peaked past any bias in [-100, 100]); a
    model with random weights gives +100's token every time, greedy and sampled, beside an
    unbiased request that decodes as it does in the same batch unbiased."""
    import random

    from workbench.models.induction import pattern_continuation, pattern_prompts

    from .conftest import INDUCTION, kv_pages

    pool = {"num_pages": kv_pages()} if device == "cuda" else {}
    llm = LLM(INDUCTION[device], device=device, max_running_reqs=8, **pool)
    try:
        rng = random.Random(11)
        prompts = pattern_prompts(rng, [rng.randint(30, 90) for _ in range(6)], period=9)
        outside = next(t for t in range(5, 100) if all(t not in p for p in prompts))
        plain = SamplingParams(max_tokens=6, ignore_eos=True)
        nudged = SamplingParams(max_tokens=6, ignore_eos=True, logit_bias={outside: 1.0})
        sampled = SamplingParams(
            max_tokens=6, ignore_eos=True, temperature=0.5, seed=3, logit_bias={outside: -1.0}
        )
        outputs, _ = run(llm, prompts, [nudged, sampled, plain, nudged, plain, plain])
        assert [o["token_ids"] for o in outputs] == [pattern_continuation(p, 6) for p in prompts]
    finally:
        llm.close()
    llm = LLM(RANDOM[device], device=device, max_running_reqs=8, **pool)
    try:
        prompts = [[3, 14, 15, 92, 65, 35], [8, 9, 7, 9, 3, 2, 3, 8, 4, 6], [2, 7, 1, 8, 2, 8]]
        forced = 77
        # (the same batch unbiased: the same forward, so the same logits, in bfloat16 too)
        unbiased, _ = run(llm, prompts, SamplingParams(max_tokens=8, ignore_eos=True))
        assert all(o["token_ids"] != [forced] * 8 for o in unbiased)
        params = [
            SamplingParams(max_tokens=8, ignore_eos=True, logit_bias={forced: 100}),
            SamplingParams(
                max_tokens=8, ignore_eos=True, temperature=1.0, seed=1, logit_bias={forced: 100}
            ),
            SamplingParams(max_tokens=8, ignore_eos=True),
        ]
        outputs, _ = run(llm, prompts, params)
        assert [o["token_ids"] for o in outputs[:2]] == [[forced] * 8] * 2
        assert outputs[2]["token_ids"] == unbiased[2]["token_ids"]
    finally:
        llm.close()


def test_biased_params_are_values_that_hash():
    """Sampling params with a bias compare by value and can key a dict or sit in a set, as
    params without one can (a dict field would make them unhashable)."""
    a, b = SamplingParams(logit_bias={5: 1.0}), SamplingParams(logit_bias={5: 1.0})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != SamplingParams(logit_bias={5: 2.0}) and a != SamplingParams()
    assert len({a, SamplingParams(logit_bias={5: 2.0}), SamplingParams()}) == 3
