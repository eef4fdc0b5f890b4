"""Batches with nothing to sample, nothing to insert, or nobody left: on the CPU and on the GPU.

A prompt chunk alone samples no token, so the forward ends with zero rows for the last norm and
the LM head (FlashInfer's fused add-norm failed there with "invalid argument" on the H200). Each
kind of empty batch runs here on the CPU (torch backend) and, with `pytest -m gpu`, on the GPU
(FlashInfer, fused and Triton kernels, CUDA graphs). The model is the planted induction model
(`models/induction.py`): its greedy answer is the pattern's continuation, known without a
reference and decisive in bf16, so every run is checked token for token on both devices.
"""

from __future__ import annotations

import random

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.engine.sampler import SamplingArgs
from workbench.models.induction import pattern_continuation, pattern_prompts

from .conftest import CPU_AND_GPU, INDUCTION

DEVICES = CPU_AND_GPU

_engines: dict[tuple[str, int], LLM] = {}


@pytest.fixture(scope="module", autouse=True)
def _free_engines():
    yield
    _engines.clear()


def engine(device: str, page_size: int = 1, **settings) -> LLM:
    """One engine per device and page size for this module, set to `settings` (reconfigured:
    weights, KV pool and CUDA graphs are kept)."""
    key = (device, page_size)
    if key not in _engines:
        _engines[key] = LLM(
            INDUCTION[device],
            device=device,
            page_size=page_size,
            num_pages=8192 // page_size,
            max_running_reqs=8,
            cuda_graph_max_bs=8,
        )
    llm = _engines[key]
    llm.scheduler.abort_all()  # a test that failed half-way leaves nothing behind
    settings = {"max_extend_tokens": 8192, "policy": "prefill_first", "overlap": False} | settings
    llm.reconfigure(record="light", **settings)
    return llm


def expected(prompts: list[list[int]], n: int) -> list[list[int]]:
    return [pattern_continuation(p, n) for p in prompts]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_a_prompt_chunk_alone_samples_nothing(device, overlap):
    """The crash of the issue: a 300-token prompt under a budget of 64, then 16, so most
    batches hold one chunk and nothing else."""
    llm = engine(device, max_extend_tokens=64, overlap=overlap)
    (prompt,) = pattern_prompts(random.Random(1), [300], period=23)
    for budget in (64, 16):
        llm.reconfigure(max_extend_tokens=budget, overlap=overlap, cache="naive")
        steps = []
        out = llm.generate([prompt], greedy(4), on_step=steps.append)
        llm.check_integrity()
        assert out[0]["token_ids"] == pattern_continuation(prompt, 4)
        alone = [s for s in steps if not s.tokens]
        assert len(alone) == -(-300 // budget) - 1  # every chunk but the last


@pytest.mark.parametrize("device", DEVICES)
def test_a_mixed_batch_whose_prompt_rows_sample_nothing(device):
    """Mixed policy: decodes share batches with a long prompt's chunks; only the decodes are
    sampled until the prompt's last chunk."""
    llm = engine(device, policy="mixed", max_extend_tokens=24)
    rng = random.Random(2)
    short = pattern_prompts(rng, [20, 30], period=5)
    (long,) = pattern_prompts(rng, [200], period=11)
    sched = llm.scheduler
    uids = [sched.add_request(p, greedy(40)) for p in short]
    sched.step()  # the short prompts; they decode from now on
    uids.append(sched.add_request(long, greedy(6)))
    records = []
    while not sched.is_idle:
        records.append(sched.step() or sched.flush())
    llm.check_integrity()
    mixed_chunk_only = [
        o
        for o in records
        if o.phase == "mixed"
        and any(r.kind == "chunk" for r in o.rows)
        and len(o.tokens) == sum(r.kind == "decode" for r in o.rows)
    ]
    assert len(mixed_chunk_only) >= 5
    got = [(r := sched.finished.pop(u)).token_ids[r.prompt_len :] for u in uids]
    assert got == [pattern_continuation(p, n) for p, n in zip([*short, long], (40, 40, 6))]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_left_empty_by_aborts(device, overlap):
    """Every request aborted between steps (with overlap: while their next batch is in flight,
    one of them mid-prompt): the engine drops their tokens, frees everything once, and serves
    the next request correctly."""
    llm = engine(device, max_extend_tokens=32, overlap=overlap)
    rng = random.Random(3)
    decoding = pattern_prompts(rng, [40, 45], period=7)
    (chunked,) = pattern_prompts(rng, [150], period=13)
    sched = llm.scheduler
    uids = [sched.add_request(p, greedy(50)) for p in decoding]
    for _ in range(3):
        sched.step()
    uids.append(sched.add_request(chunked, greedy(5)))
    sched.step()  # the long prompt's first chunk; with overlap its second is in flight
    holding = [r.uid for r in sched.live_reqs]
    assert set(holding) == set(uids)
    for uid in uids:
        sched.abort(uid)
    assert not sched.decode.running and not sched.prefill.queue
    while (record := sched.step() or sched.flush()) is not None:
        assert all(t is None for t in record.tokens)  # nothing after an abort is kept
    assert sched.is_idle
    llm.check_integrity()
    for uid, prompt in zip(uids, [*decoding, chunked]):
        req = sched.finished.pop(uid)
        got = req.token_ids[req.prompt_len :]
        assert req.finish_reason == "abort" and got == pattern_continuation(prompt, len(got))
    fresh = pattern_prompts(rng, [60], period=9)
    assert llm.generate(fresh, greedy(8))[0]["token_ids"] == expected(fresh, 8)[0]
    llm.check_integrity()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_decode_batches_padded_to_a_graph_size(device, overlap):
    """3 and 5 requests decode in batches padded to 4 and 8 on the GPU (the padding rows read
    and write the dummy slot); as they finish one by one, every size down to 1 runs."""
    llm = engine(device, overlap=overlap)
    rng = random.Random(4)
    for count in (3, 5):
        prompts = [pattern_prompts(rng, [rng.randint(12, 60)], period=5)[0] for _ in range(count)]
        params = [greedy(4 + 3 * i) for i in range(count)]
        steps = []
        out = llm.generate(prompts, params, on_step=steps.append)
        llm.check_integrity()
        assert [o["token_ids"] for o in out] == [
            pattern_continuation(p, s.max_tokens) for p, s in zip(prompts, params)
        ]
        decode = [s for s in steps if s.phase == "decode"]
        assert {s.size for s in decode} == set(range(1, count + 1))
        if device == "cuda":
            padded = {(s.size, s.padded_size) for s in decode}
            assert (3, 4) in padded and all(s.cuda_graph for s in decode)
            assert count == 3 or (5, 8) in padded


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_with_no_rows(device):
    """Every sampler path given zero rows returns zero tokens (the Triton kernel would
    otherwise launch a grid of zero programs)."""
    llm = engine(device)
    sampler, vocab = llm.engine.sampler, llm.engine.model_config.vocab_size
    logits = torch.empty(0, vocab, device=device, dtype=llm.engine.dtype)
    empty = torch.empty(0, device=device)
    paths = {
        "greedy": sampler.prepare([]),
        "temperature": SamplingArgs(all_greedy=False, temperatures=empty),
        "top-k and top-p": SamplingArgs(
            all_greedy=False,
            temperatures=empty,
            top_k=empty.long(),
            top_p=empty,
            seeded=[],
        ),
    }
    if device == "cuda" and sampler.fused:
        paths["fused kernel"] = SamplingArgs(
            all_greedy=False, temperatures=empty, keys=empty.long()
        )
    for name, args in paths.items():
        if args.seeded is None:
            args.seeded = []
        tokens = sampler.sample(logits, args)
        assert tokens.shape == (0,), name


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_the_radix_cache_inserting_nothing(device, overlap):
    """Pages of 16 and chunks of 5: the first chunks fill no whole page, so caching the
    prompt so far inserts nothing; prompts shorter than a page leave nothing to the cache
    when they finish. Requests sharing a document still meet in the cache later."""
    llm = engine(device, page_size=16, max_extend_tokens=5, overlap=overlap)
    rng = random.Random(5)
    prompts = [
        *pattern_prompts(rng, [9, 12, 15], period=3),  # shorter than a page
        *pattern_prompts(rng, [40, 56, 71], period=6),  # one document, three lengths
    ]
    inserts = []
    with llm.hooks.scoped({"cache.insert": inserts.append}):
        out = llm.generate(prompts, greedy(6))
        llm.check_integrity()
        again = llm.generate(prompts[3:], greedy(6))
    llm.check_integrity()
    assert [o["token_ids"] for o in out] == expected(prompts, 6)
    assert [o["token_ids"] for o in again] == expected(prompts[3:], 6)
    assert inserts and all(e.inserted_len > 0 and e.inserted_len % 16 == 0 for e in inserts)
    assert all(o["cached_tokens"] == 0 for o in out[:3])
    assert [o["cached_tokens"] for o in again] == [32, 48, 64]
