"""CUDA graphs of prefill and mixed steps (`engine/graph.py`) on the GPU: the same logits
as the same padded steps run eagerly, close to the unpadded eager ones, the planted model's
answers for every policy and small chunks with aborts, and records that say which steps
replayed a graph and how much they padded.

Run with `pytest -m gpu -s tests/test_gpu_prefill_graphs.py`: it prints each path's host time
per prompt step (figures, not assertions)."""

from __future__ import annotations

import gc
import random

import pytest
import torch

from workbench import LLM, SamplingParams, Workbench
from workbench.engine.graph import token_sizes
from workbench.models.induction import pattern_continuation, pattern_prompts

from .conftest import make_llm, prefill_logits, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PATHS = {  # how prompt steps run: captured graphs, the same padded steps eagerly, unpadded
    "graphs": dict(cuda_graph=True),
    "padded": dict(cuda_graph=False),
    "eager": dict(cuda_graph_max_tokens=0),
}


def _prompt_steps(llm: LLM):
    steps = llm.history.steps
    return steps[steps.phase != "decode"]


def test_no_garbage_collection_starts_while_a_graph_is_captured():
    """torch no longer collects garbage before a capture, and a collection inside one that
    destroys another engine's graphs (an LLM dropped without close(), a notebook cell run
    again) ends it: "operation not permitted when stream is capturing" (on the H100,
    2026-12-06, after test_gpu_numerics.py's module fixture dropped its LLM). With collections
    made frequent (every 100 allocations; the process's objects frozen, so each is cheap), an
    engine that captures its graphs starts none while a stream captures.

    That can fail only if collections fell due during the captures: each collection's backlog
    (`gc.get_count()` as it starts, the objects allocated since the last one) shows it. The
    first after the captures finds several collections' worth (how many collections start in
    all depends on what earlier tests left built: 4,836 alone on the H100, 79 after tests-b's
    others)."""
    starts: list[tuple[bool, int]] = []  # (a stream was capturing, the collection's backlog)

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            starts.append((torch.cuda.is_current_stream_capturing(), gc.get_count()[0]))

    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.callbacks.append(watch)
    gc.set_threshold(100, 1, 1)
    try:
        llm = make_llm(record="off")
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(watch)
        gc.unfreeze()
    try:
        assert llm.engine.captures_graphs
        rng = random.Random(3)
        prompts = pattern_prompts(rng, [rng.randint(20, 200) for _ in range(8)], period=7)
        outputs = llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
        assert all(len(o["token_ids"]) == 4 for o in outputs)
        llm.check_integrity()
    finally:
        llm.close()
    capturing = sum(c for c, _ in starts)
    backlog = max(b for _, b in starts)
    print(
        f"\n{len(starts)} collections while the engine was built, {capturing} while a stream"
        f" captured; the largest backlog {backlog} objects (a collection is due every 100)"
    )
    assert capturing == 0
    assert backlog > 300, "no collection fell due while the graphs were captured: vacuous"


def test_prefill_graph_logits_equal_the_padded_eager_ones():
    """Replaying a graph gives bit for bit what running its padded step eagerly gives; against
    unpadded eager steps (other GEMM shapes) the stated tolerance is bf16 rounding: max abs
    error within 5% of the largest logit, worst-row cosine at least 0.999."""
    prompts = random_prompts(12, 8, 200, seed=11)
    logits, host = {}, {}
    for name, options in PATHS.items():
        llm = make_llm(record="light", **options)
        try:
            logits[name] = prefill_logits(llm, prompts)
            llm.generate(prompts[:4], SamplingParams(max_tokens=1))  # the host, warm
            host[name] = _prompt_steps(llm).host_forward_ms.median()
            steps = _prompt_steps(llm)
            assert steps.cuda_graph.all() == (name == "graphs")
            llm.check_integrity()
        finally:
            llm.close()
    assert torch.equal(logits["graphs"], logits["padded"])
    ref, got = logits["eager"], logits["graphs"]
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item()
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1).min().item()
    top1 = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(
        f"\nprefill graphs vs unpadded eager, 12 prompts: max |logit| {scale:.3f}, max abs err "
        f"{err:.4f}, min cosine {cos:.6f}, top-1 agreement {top1:.0%}; host forward stage of "
        "a prompt step (median): " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in host.items())
    )
    assert err <= 0.05 * scale
    assert cos >= 0.999


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("policy", ["prefill_first", "decode_first", "mixed"])
def test_planted_answers_with_small_chunks_and_aborts(policy, path):
    """Chunks of 16 and 64 tokens while others decode, one request aborted mid-prompt: every
    finished output is the pattern's continuation whatever path the prompt steps take, and
    the steps that replayed a graph are exactly the prompt steps that fit one."""
    options = dict(cuda_graph_max_tokens=256) | PATHS[path]
    wb = Workbench(
        "dummy:qwen3-induction",
        num_pages=8192,
        max_running_reqs=16,
        cuda_graph_max_bs=16,
        record="light",
        **options,
    )
    try:
        rng = random.Random(7)
        lengths = [rng.randint(20, 300) for _ in range(10)]
        prompts = pattern_prompts(rng, lengths, period=13)
        for chunk in (16, 64):
            wb.reconfigure(max_extend_tokens=chunk, policy=policy)
            uids = [
                wb.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True), i)
                for i, p in enumerate(prompts)
            ]
            victim = uids[-1]  # 300-odd tokens: mid-prompt for several steps
            aborted = False
            while not wb.is_done:
                wb.step()
                live = {r.uid for r in wb.scheduler.live_reqs}
                if not aborted and victim in live and wb.history.steps.step.size > 3:
                    wb.abort(victim)
                    aborted = True
            wb.check_integrity()
            outputs = {o["uid"]: o for o in wb.outputs()}
            for uid, prompt in zip(uids[:-1], prompts[:-1]):
                assert outputs[uid]["token_ids"] == pattern_continuation(prompt, 12)
            assert outputs[victim]["finish_reason"] == "abort"
        steps = wb.history.steps
        prompt = steps.phase != "decode"
        fits = (steps.num_tokens <= 256) & (steps.batch_size <= 16)
        graphs = path == "graphs"
        assert (steps.cuda_graph[prompt] == (fits[prompt] & graphs)).all()
        padded = steps[prompt & fits & (path != "eager")]
        sizes = set(token_sizes(256))
        assert set(padded.num_tokens + padded.padding_tokens) <= sizes
        assert (padded.padding_tokens >= 0).all()
        if path == "eager":
            assert (steps.padding_tokens[prompt] == 0).all()
    finally:
        wb.close()


def test_mixed_steps_of_a_full_decode_batch_fit_a_graph():
    """Chunks beside 64 decoding requests (the shapes the nano-vllm workload's mixed steps
    take) replay graphs; outputs are complete and the pool is intact."""
    llm = make_llm(policy="mixed", max_extend_tokens=256, record="light")
    try:
        prompts = random_prompts(64, 100, 400, seed=3)
        out = llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
        llm.check_integrity()
        assert all(o["completion_tokens"] == 24 for o in out)
        mixed = llm.history.steps.query("phase == 'mixed'")
        assert len(mixed) > 0 and mixed.cuda_graph.all()
        print(
            f"\nmixed steps: {len(mixed)}, median {mixed.batch_size.median():.0f} requests, "
            f"{mixed.num_tokens.median():.0f} tokens (padded {mixed.padding_tokens.median():.0f}), "
            f"host forward stage {mixed.host_forward_ms.median():.2f} ms, device "
            f"{mixed.device_ms.median():.2f} ms"
        )
    finally:
        llm.close()
