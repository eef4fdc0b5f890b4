"""Tensor parallelism on GPUs (`pytest -m gpu`; run with -s: the figures are printed).

On two GPUs (NCCL; skipped with fewer): prefill logits of TP=2 against TP=1 on the same seeded
random model, within a stated bf16 tolerance; greedy tokens of TP=2 equal the planted induction
model's answer (its logits are peaked, so bf16 rounding cannot flip them) with CUDA graphs and
overlap on and off; a profiled step shows rank 0's all-reduces as communication.

On one GPU (`tp_backend="gloo"`: both ranks share it, no CUDA graphs): the same logits and
planted answers, and a stepped run with an abort, so every single-GPU session runs the
tensor-parallel engine's GPU path (workers on CUDA, FlashInfer with a rank's heads, polled
waits, per-rank device times)."""

from __future__ import annotations

import random

import pytest
import torch

from workbench import LLM, SamplingParams, Workbench
from workbench.history.families import breakdown_table
from workbench.models.induction import pattern_continuation, pattern_prompts

from .conftest import prefill_logits, random_prompts
from .test_gpu_numerics import _logit_gap

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")

MODEL = "dummy:qwen3-0.6b"
PEAKED = "dummy:qwen3-induction"


BACKENDS = [pytest.param("nccl", marks=two_gpus), "gloo"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_logits_of_two_ranks_match_one(backend):
    """Stated tolerance: the ranks sum half-products in another order (an all-reduce of bf16
    partial sums instead of one GEMM), so logits differ by bf16 rounding: max abs error within
    5% of the largest logit, worst-row cosine at least 0.999."""
    prompts = random_prompts(32, 16, 256, seed=1)
    with LLM(MODEL, tp_size=1, memory_ratio=0.3) as one:
        ref = prefill_logits(one, prompts)
    with LLM(MODEL, tp_size=2, tp_backend=backend, memory_ratio=0.3) as two:
        got = prefill_logits(two, prompts)
        two.check_integrity()
    gap = _logit_gap(got, ref)
    scale = ref.abs().max().item()
    print(
        f"\nTP=2 ({backend}) vs TP=1 prefill logits, 32 prompts, max |logit| {scale:.3f}: max "
        f"abs err {gap['max']:.4f}, mean abs err {gap['mean']:.5f}, min cosine "
        f"{gap['cos']:.6f}, top-1 agreement {gap['top1']:.0%}"
    )
    assert gap["max"] <= 0.05 * scale
    assert gap["cos"] >= 0.999


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize(
    "backend, cuda_graph",
    [
        pytest.param("nccl", True, marks=two_gpus, id="nccl-graphs"),
        pytest.param("nccl", False, marks=two_gpus, id="nccl-eager"),
        pytest.param("gloo", False, id="gloo-eager"),  # gloo's all-reduces cannot be captured
    ],
)
def test_greedy_two_ranks_give_the_planted_answer(backend, cuda_graph, overlap):
    rng = random.Random(0)
    prompts = pattern_prompts(rng, [rng.randint(20, 300) for _ in range(48)], period=9)
    with LLM(
        PEAKED,
        tp_size=2,
        tp_backend=backend,
        cuda_graph=cuda_graph,
        overlap=overlap,
        memory_ratio=0.3,
        max_extend_tokens=512,
    ) as llm:
        assert llm.engine.config.cuda_graph_enabled == cuda_graph
        outputs = llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
        llm.check_integrity()
    same = sum(o["token_ids"] == pattern_continuation(p, 24) for o, p in zip(outputs, prompts))
    print(
        f"\nTP=2 ({backend}) greedy, graphs {cuda_graph}, overlap {overlap}: {same}/48 answers "
        "equal the planted continuation"
    )
    assert same == len(prompts)


def test_two_ranks_on_one_gpu_step_abort_and_time_each_rank():
    """Stepping by hand with small chunks and an abort mid-prompt: the others still give the
    planted answer, every rank's table stays equal, and each step has both ranks' times."""
    rng = random.Random(1)
    prompts = pattern_prompts(rng, [rng.randint(40, 200) for _ in range(8)], period=7)
    with Workbench(
        PEAKED, tp_size=2, tp_backend="gloo", memory_ratio=0.3, max_extend_tokens=64
    ) as wb:
        assert wb.llm.engine.num_devices == 1
        uids = [wb.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts]
        wb.step(2)
        wb.abort(uids[5])
        wb.run(progress=False)
        wb.check_integrity()
        outputs = {o["uid"]: o for o in wb.outputs()}
        steps = wb.history.steps
    kept = [(u, p) for u, p in zip(uids, prompts) if u != uids[5]]
    same = sum(outputs[u]["token_ids"] == pattern_continuation(p, 12) for u, p in kept)
    print(
        f"\nTP=2 (gloo, one GPU) stepped, chunk 64: {same}/{len(kept)} planted answers, "
        f"{len(steps)} steps, device ms median rank 0 {steps.device_ms.median():.2f}, "
        f"rank 1 {steps.device_ms_rank1.median():.2f}"
    )
    assert outputs[uids[5]]["finish_reason"] == "abort"
    assert same == len(kept)
    assert set(steps.tp_size) == {2}
    assert steps.device_ms_rank1.notna().all() and (steps.device_ms_rank1 > 0).all()


@two_gpus
def test_a_profiled_step_shows_the_all_reduces():
    with Workbench(MODEL, tp_size=2, record="full", memory_ratio=0.3) as wb:
        for p in random_prompts(8, 50, 200, seed=3):
            wb.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True))
        wb.run(progress=False)
        wb.check_integrity()
        by_family = breakdown_table(wb.history).groupby("family").ms.sum()
        steps = wb.history.steps
    print(f"\nTP=2 profiled run, ms by family on rank 0: {by_family.round(2).to_dict()}")
    assert by_family.get("communication", 0) > 0
    assert set(steps.tp_size) == {2}
