"""Log probabilities of the output tokens (`SamplingParams(logprobs=n)`): the model's own (the
log-softmax of its logits, before temperature, top-k and top-p), equal to Hugging Face's in
float32 on the CPU for the same tokens, under chunked prompts, overlap and sampling, with the n
most likely tokens at each position; requests that do not ask report none and sample alike.
The prompt's too (`prompt_logprobs=n`): each prompt token's given those before it."""

from __future__ import annotations

import pytest
import torch

from workbench import LLM, SamplingParams

from .conftest import CPU_AND_GPU, PROMPTS, hf_model, run, shared

MODEL = "tiny-qwen3"


def _hf_logprobs(name: str, prompt: list[int], output: list[int]) -> torch.Tensor:
    """log-softmax [len(output), vocab] at each output token's position, by one forward of
    Hugging Face's model over prompt + output (teacher-forced)."""
    ids = torch.tensor([prompt + output])
    with torch.inference_mode():
        logits = hf_model(name)(ids).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)


def _llm(**options) -> LLM:
    return shared(lambda: LLM(MODEL, max_running_reqs=8, **options), MODEL, *options.items())


@pytest.mark.parametrize("max_extend_tokens, overlap", [(8192, False), (3, True), (16, False)])
def test_greedy_logprobs_are_hugging_faces(max_extend_tokens, overlap):
    """Each output token's log probability and the 5 most likely tokens there equal Hugging
    Face's (float32 rounding), the tokens are Hugging Face's greedy ones (the most likely), and
    the pool is intact."""
    llm = _llm(overlap=overlap)
    llm.reconfigure(max_extend_tokens=max_extend_tokens)
    prompts = [llm.encode(p) for p in PROMPTS]
    outputs, _ = run(llm, prompts, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=5))
    for prompt, out in zip(prompts, outputs):
        ref = _hf_logprobs(MODEL, prompt, out["token_ids"])
        assert len(out["logprobs"]) == len(out["token_ids"]) == 8
        for position, (token, (logprob, top)) in enumerate(zip(out["token_ids"], out["logprobs"])):
            assert logprob == pytest.approx(ref[position, token].item(), abs=1e-4)
            assert len(top) == 5 and top[0][0] == token  # greedy: the most likely
            values, ids = ref[position].topk(5)
            assert [i for i, _ in top] == ids.tolist()
            assert [v for _, v in top] == pytest.approx(values.tolist(), abs=1e-4)


def test_sampled_tokens_report_the_models_logprobs_not_the_tempered_ones():
    """At temperature 1.7 with top-k 20, a sampled token's log probability is still the model's
    (what Hugging Face's forward gives for that token), not that of the distribution it was
    drawn from; n=0 reports the token's alone."""
    llm = _llm(overlap=False)
    llm.reconfigure(max_extend_tokens=8192)
    prompts = [llm.encode(p) for p in PROMPTS[:3]]
    sampling = SamplingParams(max_tokens=6, temperature=1.7, top_k=20, seed=7, logprobs=0)
    outputs, _ = run(llm, prompts, sampling)
    tempered_differs = False
    for prompt, out in zip(prompts, outputs):
        ref = _hf_logprobs(MODEL, prompt, out["token_ids"])
        for position, (token, (logprob, top)) in enumerate(zip(out["token_ids"], out["logprobs"])):
            assert top == []
            assert logprob == pytest.approx(ref[position, token].item(), abs=1e-4)
            row = ref[position] / 1.7
            tempered = torch.log_softmax(row, -1)[token].item()
            tempered_differs |= abs(tempered - logprob) > 1e-3
    assert tempered_differs


def test_only_the_requests_that_ask_report_and_all_sample_alike():
    """In one batch, requests with and without logprobs: the tokens are those of a run where
    none asks, the ones that did not ask report None, the others as many top tokens as each
    asked for."""
    llm = _llm(overlap=True)
    llm.reconfigure(max_extend_tokens=16)
    prompts = [llm.encode(p) for p in PROMPTS]
    plain = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, seed=3)
    asks = [None, 2, None, 0, 20]
    mixed = [
        SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.8, seed=3, logprobs=n)
        for n in asks
    ]
    alone, _ = run(llm, prompts, plain)
    together, _ = run(llm, prompts, mixed)
    assert [o["token_ids"] for o in together] == [o["token_ids"] for o in alone]
    for n, out in zip(asks, together):
        if n is None:
            assert out["logprobs"] is None
        else:
            assert [len(top) for _, top in out["logprobs"]] == [n] * 6


@pytest.mark.slow  # SmolLM2 (~13 s); EOS under overlap: test_overlap.py
def test_a_request_that_ends_on_eos_under_overlap_reports_its_tokens_only():
    """Under overlap the batch after a request's EOS was launched before the EOS reached the
    host: the token it sampled there is dropped, and so is its log probability; every other
    token keeps its own, as without overlap (SmolLM2 answering chats, which end on EOS)."""
    from .test_overlap import chat_prompts

    llm = shared(lambda: LLM("smollm2", max_running_reqs=4), "smollm2")
    prompts = chat_prompts(llm)
    sampling = SamplingParams(max_tokens=48, logprobs=1)
    results = {}
    for overlap in (True, False):
        llm.reconfigure(overlap=overlap)
        results[overlap], _ = run(llm, prompts, sampling)
    assert sum(o["finish_reason"] == "stop" for o in results[True]) >= 2
    for a, b in zip(results[True], results[False]):
        assert a["token_ids"] == b["token_ids"]
        assert len(a["logprobs"]) == len(a["token_ids"])
        assert [lp for lp, _ in a["logprobs"]] == pytest.approx(
            [lp for lp, _ in b["logprobs"]], abs=1e-5
        )


@pytest.mark.parametrize(
    "value, error",
    [(-1, ValueError), (21, ValueError), (True, TypeError), (2.0, TypeError)],
)
def test_a_bad_logprobs_is_refused_by_name(value, error):
    with pytest.raises(error, match=r"logprobs must be an integer in \[0, 20\]"):
        SamplingParams(logprobs=value)


def _hf_prompt_logprobs(name: str, prompt: list[int]) -> torch.Tensor:
    """log-softmax [len(prompt) - 1, vocab] at each prompt position before the last."""
    with torch.inference_mode():
        logits = hf_model(name)(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1)


@pytest.mark.parametrize("max_extend_tokens, overlap", [(8192, False), (3, True), (16, False)])
def test_prompt_logprobs_are_hugging_faces(max_extend_tokens, overlap):
    """Each prompt token's log probability given those before it, and the 3 most likely tokens
    there, equal Hugging Face's forward over the prompt (float32 rounding), whole prompts or in
    chunks of 3 and 16, with and without overlap; the first token has none; the output tokens
    are those of requests that do not ask."""
    llm = _llm(overlap=overlap)
    llm.reconfigure(max_extend_tokens=max_extend_tokens)
    prompts = [llm.encode(p) for p in PROMPTS]
    plain = SamplingParams(max_tokens=4, ignore_eos=True)
    asked = SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=3)
    without, _ = run(llm, prompts, plain)
    outputs, steps = run(llm, prompts, asked)
    assert [o["token_ids"] for o in outputs] == [o["token_ids"] for o in without]
    assert all(o["prompt_logprobs"] is None for o in without)
    for prompt, out in zip(prompts, outputs):
        ref = _hf_prompt_logprobs(MODEL, prompt)
        entries = out["prompt_logprobs"]
        assert len(entries) == len(prompt) and entries[0] is None
        for position, (logprob, top) in enumerate(entries[1:]):
            assert logprob == pytest.approx(ref[position, prompt[position + 1]].item(), abs=1e-4)
            values, ids = ref[position].topk(3)
            assert [i for i, _ in top] == ids.tolist()
            assert [v for _, v in top] == pytest.approx(values.tolist(), abs=1e-4)
    if max_extend_tokens == 3:  # they did run in chunks
        assert any(r.kind == "chunk" for s in steps for r in s.rows)


def test_a_cached_prompt_is_computed_again_for_its_log_probabilities():
    """A prompt whose prefix the cache holds (the same prompt, asked before without them): the
    request asking for prompt log probabilities takes nothing from the cache and reports every
    position, as the first time; the one that does not ask still takes the cached prefix."""
    llm = _llm(overlap=False)
    llm.reconfigure(max_extend_tokens=8192)
    prompt = llm.encode(PROMPTS[2])
    first, _ = run(llm, [prompt], SamplingParams(max_tokens=2, prompt_logprobs=1))
    again, _ = run(llm, [prompt], SamplingParams(max_tokens=2))
    asked, _ = run(llm, [prompt], SamplingParams(max_tokens=2, prompt_logprobs=1))
    assert again[0]["cached_tokens"] > 0 and asked[0]["cached_tokens"] == 0
    assert [lp for lp, _ in asked[0]["prompt_logprobs"][1:]] == pytest.approx(
        [lp for lp, _ in first[0]["prompt_logprobs"][1:]], abs=1e-5
    )


def test_a_step_computes_at_most_its_share_of_prompt_log_probabilities(monkeypatch):
    """Past `PROMPT_LOGPROB_ROWS` positions a step, a request asking for prompt log
    probabilities waits (or runs a shorter chunk), and every position is still reported once;
    the others are admitted as before."""
    from workbench.scheduler import prefill

    monkeypatch.setattr(prefill, "PROMPT_LOGPROB_ROWS", 7)
    llm = _llm(overlap=True)
    llm.reconfigure(max_extend_tokens=8192)
    prompts = [llm.encode(p) for p in PROMPTS[:4]]
    asks = [SamplingParams(max_tokens=3, ignore_eos=True, prompt_logprobs=0)] * 3
    outputs, steps = run(llm, prompts, [*asks, SamplingParams(max_tokens=3, ignore_eos=True)])
    for prompt, out in zip(prompts[:3], outputs[:3]):
        assert len(out["prompt_logprobs"]) == len(prompt)
        ref = _hf_prompt_logprobs(MODEL, prompt)
        want = [ref[i, prompt[i + 1]].item() for i in range(len(prompt) - 1)]
        assert [lp for lp, _ in out["prompt_logprobs"][1:]] == pytest.approx(want, abs=1e-4)
    asking = {o["uid"] for o in outputs[:3]}
    for step in steps:
        rows = [r for r in step.rows if r.uid in asking and r.kind != "decode"]
        assert sum(r.extend_len for r in rows) <= 7, step


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_the_planted_model_is_sure_of_each_repeat_in_its_prompt(device):
    """The planted induction model (on the GPU in bfloat16, its logits peaked): past two
    periods of a prompt's pattern, each prompt token is the most likely there, at a log
    probability near 0, in chunks of 16 beside other prompts; asking changes no output token
    (on the GPU the asking steps run eagerly, the others in CUDA graphs)."""
    import random

    from workbench.models.induction import pattern_continuation, pattern_prompts

    from .conftest import INDUCTION, kv_pages

    pool = {"num_pages": kv_pages()} if device == "cuda" else {}
    llm = LLM(INDUCTION[device], device=device, max_running_reqs=8, max_extend_tokens=16, **pool)
    try:
        rng = random.Random(5)
        prompts = pattern_prompts(rng, [rng.randint(30, 90) for _ in range(6)], period=9)
        plain = SamplingParams(max_tokens=4, ignore_eos=True)
        asks = [SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=2)] * 3
        outputs, _ = run(llm, prompts, [*asks, plain, plain, plain])
        assert [o["token_ids"] for o in outputs] == [pattern_continuation(p, 4) for p in prompts]
        for prompt, out in zip(prompts[:3], outputs[:3]):
            entries = out["prompt_logprobs"]
            assert len(entries) == len(prompt)
            for position in range(18, len(prompt) - 1):
                logprob, top = entries[position + 1]
                assert top[0][0] == prompt[position + 1] and logprob > -0.1, (position, top)
        assert all(o["prompt_logprobs"] is None for o in outputs[3:])
    finally:
        llm.close()


@pytest.mark.parametrize(
    "value, error",
    [(-1, ValueError), (21, ValueError), (True, TypeError), ("2", TypeError)],
)
def test_a_bad_prompt_logprobs_is_refused_by_name(value, error):
    with pytest.raises(error, match=r"prompt_logprobs must be an integer in \[0, 20\]"):
        SamplingParams(prompt_logprobs=value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cuda_graph", [True, False], ids=["graphs", "eager"])
def test_gpu_logprobs_where_the_graph_samples(cuda_graph):
    """On the GPU (bfloat16), where a decode graph samples inside itself, with the planted
    induction model (peaked logits: decisive in bf16): asking for logprobs changes no token, the
    tokens continue the patterns and each is the most likely there, and at the last one the
    log probabilities of the most likely tokens are within 2% (and 0.05) of what one prefill of
    the same tokens gives (bf16 rounding under two batchings)."""
    import random

    from workbench.models.induction import pattern_continuation, pattern_prompts

    from .conftest import kv_pages

    llm = LLM(
        "dummy:qwen3-induction",
        num_pages=kv_pages(),
        max_running_reqs=16,
        cuda_graph=cuda_graph,
        record="off",
    )
    try:
        rng = random.Random(5)
        prompts = pattern_prompts(rng, [rng.randint(20, 300) for _ in range(8)], period=9)
        plain = SamplingParams(max_tokens=8, ignore_eos=True)
        asked = SamplingParams(max_tokens=8, ignore_eos=True, logprobs=4)
        without = llm.generate(prompts, plain)
        outputs = llm.generate(prompts, asked)
        assert [o["token_ids"] for o in outputs] == [o["token_ids"] for o in without]
        assert [o["token_ids"] for o in outputs] == [pattern_continuation(p, 8) for p in prompts]
        worst = 0.0
        for prompt, out in zip(prompts, outputs):
            for token, (_, top) in zip(out["token_ids"], out["logprobs"]):
                assert top[0][0] == token and len(top) == 4
            full = prompt + out["token_ids"][:-1]
            again = llm.generate([full], SamplingParams(max_tokens=1, logprobs=4))[0]
            top, top_again = out["logprobs"][-1][1], again["logprobs"][0][1]
            # (the runner-ups may lie within bf16 rounding of each other: compare those in both)
            mine, theirs = dict(top), dict(top_again)
            common = [i for i in mine if i in theirs]
            assert top[0][0] == top_again[0][0] and len(common) >= 2, (top, top_again)
            for i in common:
                assert abs(mine[i] - theirs[i]) <= 0.02 * abs(theirs[i]) + 0.05, (top, top_again)
                worst = max(worst, abs(mine[i] - theirs[i]))
        llm.check_integrity()
        print(
            f"\nthe last position's 4 log probabilities, decode against prefill: max |err| {worst}"
        )
    finally:
        llm.close()
