"""Penalties on the tokens so far (`SamplingParams.presence_penalty`, `frequency_penalty`,
`repetition_penalty`), counted on the device from the request's tokens in the table: greedy,
the repetition penalty equals Hugging Face `generate(repetition_penalty=...)` and OpenAI's
presence and frequency penalties Hugging Face `generate` with a logits processor of them,
token for token in float32, under chunked prompts, overlap on and off and beside unpenalized
requests."""

from __future__ import annotations

import functools

import pytest
import torch

from workbench import LLM, SamplingParams

from .conftest import CPU_AND_GPU, PROMPTS, hf_generate, hf_greedy, run, shared

MODEL = "smollm2"
MAX_NEW = 10


@functools.cache
def _hf_repetition(ids: tuple[int, ...], penalty: float) -> list[int]:
    return hf_generate(MODEL, ids, MAX_NEW, repetition_penalty=penalty)


@functools.cache
def _hf_openai_penalties(
    ids: tuple[int, ...], presence: float, frequency: float, max_new: int
) -> list[int]:
    """Hugging Face `generate`, greedy, with OpenAI's penalties over the output so far as a
    logits processor of its own (Hugging Face has none)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class OpenAIPenalties(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            output = input_ids[:, len(ids) :]
            counts = torch.zeros_like(scores).scatter_add_(
                1, output, torch.ones_like(output, dtype=scores.dtype)
            )
            return scores - frequency * counts - presence * (counts > 0)

    processors = LogitsProcessorList([OpenAIPenalties()])
    return hf_generate(MODEL, ids, max_new, logits_processor=processors)


def _llm() -> LLM:
    return shared(lambda: LLM(MODEL, max_running_reqs=8), MODEL, "penalties")


SETTINGS = [(8192, True), (8192, False), (4, True)]


@pytest.mark.parametrize("max_extend_tokens, overlap", SETTINGS, ids=str)
def test_greedy_repetition_penalty_equals_hf(max_extend_tokens, overlap):
    llm = _llm()
    llm.reconfigure(max_extend_tokens=max_extend_tokens, overlap=overlap)
    ids = [llm.encode(p) for p in PROMPTS[:4]]
    penalties = [1.3, 1.15, 0.8, 1.0]  # below 1 favours repeats; the last none
    params = [
        SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, repetition_penalty=r) for r in penalties
    ]
    outputs, _ = run(llm, ids, params)
    want = [_hf_repetition(tuple(p), r) for p, r in zip(ids, penalties)]
    assert [o["token_ids"] for o in outputs] == want
    plain = hf_greedy(MODEL, ids, MAX_NEW)
    assert outputs[0]["token_ids"] != plain[0] and outputs[3]["token_ids"] == plain[3]


@pytest.mark.parametrize("max_extend_tokens, overlap", SETTINGS, ids=str)
def test_greedy_presence_and_frequency_penalties_equal_hf_with_them_as_a_processor(
    max_extend_tokens, overlap
):
    llm = _llm()
    llm.reconfigure(max_extend_tokens=max_extend_tokens, overlap=overlap)
    # each changes its prompt's greedy answer within 16 tokens (a negative one favours repeats)
    asked = {1: (2.0, 0.0), 4: (0.0, 2.0), 3: (1.0, 1.0), 0: (-2.0, 0.0)}
    ids = [llm.encode(PROMPTS[i]) for i in asked]
    params = [
        SamplingParams(max_tokens=16, ignore_eos=True, presence_penalty=p, frequency_penalty=f)
        for p, f in asked.values()
    ]
    outputs, _ = run(llm, ids, params)
    want = [_hf_openai_penalties(tuple(i), p, f, 16) for i, (p, f) in zip(ids, asked.values())]
    assert [o["token_ids"] for o in outputs] == want
    plain = hf_greedy(MODEL, ids, 16)
    assert all(o["token_ids"] != p for o, p in zip(outputs, plain))


def test_a_penalized_sampled_request_is_the_same_alone_and_in_a_batch():
    """Each row's penalties are its own: a seeded, penalized request samples the same tokens
    alone and between requests with other penalties (the fused race and the sort for top-k)."""
    llm = _llm()
    llm.reconfigure(max_extend_tokens=8192, overlap=True)
    ids = [llm.encode(p) for p in PROMPTS[:3]]
    for extra in ({}, {"top_k": 40}):
        mine = SamplingParams(
            max_tokens=12,
            ignore_eos=True,
            temperature=0.8,
            seed=9,
            frequency_penalty=1.0,
            repetition_penalty=1.2,
            **extra,
        )
        (alone,) = llm.generate([ids[1]], mine)
        others = [
            SamplingParams(max_tokens=12, ignore_eos=True, presence_penalty=2.0),
            mine,
            SamplingParams(max_tokens=12, ignore_eos=True, temperature=1.0, seed=1),
        ]
        outputs, _ = run(llm, ids, others)
        assert outputs[1]["token_ids"] == alone["token_ids"]


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("presence_penalty", 2.5, ValueError),
        ("frequency_penalty", -3, ValueError),
        ("frequency_penalty", "1", TypeError),
        ("repetition_penalty", 0.0, ValueError),
        ("repetition_penalty", float("nan"), ValueError),
    ],
)
def test_a_bad_penalty_is_refused_by_name(field, value, error):
    with pytest.raises(error, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_penalized_requests_beside_others_where_a_graph_would_sample(device):
    """On the GPU in bfloat16 with CUDA graphs (a decode graph samples only where no request has
    a penalty): the planted induction model's requests continue their patterns, with penalties
    (its logits are peaked past them) and without, in one batch, and the pool stays whole."""
    import random

    from workbench.models.induction import pattern_continuation, pattern_prompts

    from .conftest import INDUCTION, kv_pages

    pool = {"num_pages": kv_pages()} if device == "cuda" else {}
    llm = LLM(INDUCTION[device], device=device, max_running_reqs=8, **pool)
    try:
        rng = random.Random(13)
        prompts = pattern_prompts(rng, [rng.randint(30, 90) for _ in range(5)], period=9)
        plain = SamplingParams(max_tokens=6, ignore_eos=True)
        params = [
            SamplingParams(max_tokens=6, ignore_eos=True, repetition_penalty=1.2),
            plain,
            SamplingParams(max_tokens=6, ignore_eos=True, presence_penalty=0.5),
            SamplingParams(
                max_tokens=6, ignore_eos=True, temperature=0.5, seed=2, frequency_penalty=0.5
            ),
            plain,
        ]
        outputs, _ = run(llm, prompts, params)
        assert [o["token_ids"] for o in outputs] == [pattern_continuation(p, 6) for p in prompts]
    finally:
        llm.close()


def test_the_penalties_equal_their_definition_over_the_whole_vocabulary():
    """The sampler counts a row's tokens where they sit (sorted, not scattered over the
    vocabulary): its logits equal, bit for bit, the penalties applied token by token over the
    whole vocabulary, with tokens repeated in the prompt and output, prompt tokens generated
    again, rows of unequal lengths and unpenalized rows left alone."""
    from workbench.engine.sampler import Penalties, _penalize

    gen = torch.Generator().manual_seed(0)
    vocab, span = 50, 24
    pool = torch.randint(0, 12, (6, span + 3), generator=gen, dtype=torch.int32)  # repeats
    logits = torch.randn(5, vocab, generator=gen) * 3
    rows, table_rows = [0, 2, 3], [4, 1, 0]
    prompt_lens, ends = [5, 1, 10], [20, 3, span]
    presence, frequency, repetition = [0.5, -1.0, 2.0], [0.7, 0.0, -0.4], [1.3, 0.8, 1.0]
    p = Penalties(
        *(torch.tensor(v) for v in (rows, table_rows, prompt_lens, ends)),
        *(torch.tensor(v, dtype=torch.float32) for v in (presence, frequency, repetition)),
        span=span,
    )
    want = logits.clone()
    for i, row in enumerate(rows):
        held = pool[table_rows[i], : ends[i]].tolist()
        out = held[prompt_lens[i] :]
        r, f, pr = p.repetition[i], p.frequency[i], p.presence[i]  # float32, as the sampler's
        for t in set(held):
            x = want[row, t]
            x = x / r if x > 0 else x * r
            want[row, t] = x - f * float(out.count(t)) - pr * float(t in out)
    assert torch.equal(_penalize(logits, p, pool), want)
