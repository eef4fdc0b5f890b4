"""Sampling: greedy limits, seeds independent of the batch, and the right distribution."""

from __future__ import annotations

import math

import torch

from workbench import SamplingParams
from workbench.engine.sampler import Sampler

from .conftest import PROMPTS, greedy, run


def test_same_seed_same_tokens_whatever_shares_the_batch(tiny_llm):
    p = tiny_llm.encode(PROMPTS[3])
    seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=1234, ignore_eos=True)
    alone, _ = run(tiny_llm, [p], seeded)
    noisy = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    others = [tiny_llm.encode(q) for q in PROMPTS[:2]]
    crowd, _ = run(tiny_llm, [others[0], p, others[1]], [noisy, seeded, noisy])
    assert crowd[1]["token_ids"] == alone[0]["token_ids"]
    other_seed = SamplingParams(max_tokens=12, temperature=1.0, seed=99, ignore_eos=True)
    different, _ = run(tiny_llm, [p], other_seed)
    assert different[0]["token_ids"] != alone[0]["token_ids"]


def test_top_k_one_and_tiny_top_p_are_greedy(tiny_llm):
    p = [tiny_llm.encode(q) for q in PROMPTS[:3]]
    reference, _ = run(tiny_llm, p, greedy(10))
    for sp in [
        SamplingParams(max_tokens=10, temperature=1.5, top_k=1, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=1.5, top_p=1e-6, ignore_eos=True),
        # 1e-300 is 0 in float32: the most likely token is still kept (it gave token 0)
        SamplingParams(max_tokens=10, temperature=1.5, top_p=1e-300, ignore_eos=True),
    ]:
        outputs, _ = run(tiny_llm, p, sp)
        assert [o["token_ids"] for o in outputs] == [o["token_ids"] for o in reference]


def _draw(params: SamplingParams, probs: list[float], n: int = 40000) -> torch.Tensor:
    from workbench.core import Req
    from workbench.kvcache.base import CacheHandle

    sampler = Sampler(len(probs), torch.device("cpu"), seed=0)
    reqs = [Req(i, [1, 2], 2, 0, 0, params, CacheHandle()) for i in range(n)]
    for r in reqs:
        r.complete_one()
    logits = torch.tensor([math.log(p) for p in probs]).repeat(n, 1)
    tokens = sampler.sample(logits, sampler.prepare(reqs))
    return torch.bincount(tokens.long(), minlength=len(probs)).float() / n


def test_temperature_one_reproduces_the_distribution():
    freq = _draw(SamplingParams(temperature=1.0), [0.5, 0.3, 0.2])
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.015), freq


def test_temperature_sharpens():
    freq = _draw(SamplingParams(temperature=0.5), [0.5, 0.3, 0.2])
    expect = torch.tensor([0.25, 0.09, 0.04])
    assert torch.allclose(freq, expect / expect.sum(), atol=0.015), freq


def test_top_k_and_top_p_cut_the_tail():
    freq = _draw(SamplingParams(temperature=1.0, top_k=2), [0.5, 0.3, 0.2])
    assert freq[2] == 0 and torch.allclose(freq[:2], torch.tensor([0.625, 0.375]), atol=0.015)
    # top_p=0.6: 0.5 alone falls short, 0.5 + 0.3 reaches it; 0.2 is dropped
    freq = _draw(SamplingParams(temperature=1.0, top_p=0.6), [0.5, 0.3, 0.2])
    assert freq[2] == 0 and torch.allclose(freq[:2], torch.tensor([0.625, 0.375]), atol=0.015)


def test_greedy_rows_stay_greedy_beside_sampled_ones(tiny_llm):
    p = [tiny_llm.encode(q) for q in PROMPTS[:4]]
    reference, _ = run(tiny_llm, p, greedy(10))
    hot = SamplingParams(max_tokens=10, temperature=1.5, ignore_eos=True)
    outputs, _ = run(tiny_llm, p, [greedy(10), hot, greedy(10), hot])
    assert outputs[0]["token_ids"] == reference[0]["token_ids"]
    assert outputs[2]["token_ids"] == reference[2]["token_ids"]
    assert outputs[1]["token_ids"] != reference[1]["token_ids"]  # the hot ones did sample


def _fused_args(reqs_params: list[SamplingParams], sampler: Sampler, first_output: int = 0):
    from workbench.core import Req
    from workbench.kvcache.base import CacheHandle

    reqs = [Req(i, [1, 2], 2, 0, 0, p, CacheHandle()) for i, p in enumerate(reqs_params)]
    for r in reqs:
        for _ in range(first_output + 1):
            r.complete_one()
    return sampler.prepare(reqs)


def test_fused_sampling_keys_follow_the_seed_not_the_batch():
    """The one-pass GPU kernel draws a row's noise from its key alone. Its host side runs here:
    a seeded request's key depends only on (seed, output index); unseeded rows get keys that
    differ from each other and from call to call; greedy rows get temperature 0."""
    sampler = Sampler(100, torch.device("cpu"), seed=0, fused=True)
    seeded = SamplingParams(temperature=0.7, seed=42, max_tokens=8)
    noisy = SamplingParams(temperature=0.7, max_tokens=8)
    greedy_p = SamplingParams(temperature=0.0, max_tokens=8)
    alone = _fused_args([seeded], sampler)
    crowd = _fused_args([noisy, greedy_p, seeded, noisy], sampler)
    assert alone.keys is not None and crowd.keys is not None
    assert crowd.keys[2] == alone.keys[0]
    assert torch.allclose(crowd.temperatures, torch.tensor([0.7, 0.0, 0.7, 0.7]))
    later = _fused_args([seeded], sampler, first_output=1)
    assert later.keys[0] != alone.keys[0]  # the next output token draws fresh noise
    again = _fused_args([noisy, greedy_p, seeded, noisy], sampler)
    unseeded = [crowd.keys[0], crowd.keys[3], again.keys[0], again.keys[3]]
    assert len({int(k) for k in unseeded}) == 4
    assert all(0 <= int(k) < 2**63 for k in crowd.keys)
    # top-k / top-p stay on the torch path (the kernel has no sort)
    assert _fused_args([SamplingParams(temperature=0.7, top_k=5)], sampler).keys is None
