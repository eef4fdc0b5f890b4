"""GPU overlap and CUDA graphs: identical outputs, mixed policy, EOS, hooks and abort."""

from __future__ import annotations

import random

import pytest
import torch

from workbench import SamplingParams

from .conftest import MODEL, kv_pages, make_llm, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(scope="module")
def variants():
    return {
        (overlap, graphs): make_llm(overlap=overlap, cuda_graph=graphs)
        for overlap in (False, True)
        for graphs in (False, True)
    }


def test_overlap_and_cuda_graphs_give_identical_outputs(variants):
    prompts = random_prompts(48, 8, 300, seed=3)
    rng = random.Random(4)
    params = [
        SamplingParams(max_tokens=rng.randint(1, 80), ignore_eos=True)
        if i % 2
        else SamplingParams(
            max_tokens=rng.randint(1, 80), temperature=0.8, top_p=0.9, seed=i, ignore_eos=True
        )
        for i in range(len(prompts))
    ]
    results = {}
    for key, engine in variants.items():
        outputs = engine.generate(prompts, params)
        engine.check_integrity()
        assert [o["completion_tokens"] for o in outputs] == [p.max_tokens for p in params]
        results[key] = [o["token_ids"] for o in outputs]
    base = results[(False, False)]
    for key, tokens in results.items():
        same = sum(a == b for a, b in zip(base, tokens))
        print(f"\noverlap={key[0]} cuda_graph={key[1]}: {same}/{len(base)} requests identical")
    for key, tokens in results.items():
        assert tokens == base, f"overlap={key[0]} cuda_graph={key[1]} differs"


def test_mixed_policy_with_overlap_and_graphs(variants):
    """Mixed batches run decodes through the prefill kernel, so bf16 results may differ in the
    last bits from prefill_first: the test reports the agreement and checks the bookkeeping."""
    engine = make_llm(policy="mixed", max_extend_tokens=256, record="light")
    prompts = random_prompts(48, 8, 300, seed=6)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    engine.check_integrity()
    assert all(o["completion_tokens"] == 40 for o in outputs)
    phases = engine.history.steps.phase.value_counts().to_dict()
    assert phases.get("mixed", 0) > 0
    base = variants[(True, True)].generate(prompts, params)
    same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(base, outputs))
    first = sum(a["token_ids"][0] == b["token_ids"][0] for a, b in zip(base, outputs))
    print(
        f"\nmixed (overlap, graphs) vs prefill_first: {same}/48 requests identical, "
        f"first tokens {first}/48; steps by phase {phases}"
    )


def test_eos_and_max_tokens_with_overlap_and_graphs():
    # naive cache: a second run over the same prompts computes them the same way
    engine = make_llm(cache="naive")
    prompts = random_prompts(24, 8, 64, seed=5)
    probe = engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    # make a token that greedy decoding emits mid-way the end-of-sequence token
    eos = probe[0]["token_ids"][5]
    saved = engine.scheduler.eos_ids
    engine.scheduler.eos_ids = frozenset({eos})
    try:
        outputs = engine.generate(prompts, SamplingParams(max_tokens=12))
    finally:
        engine.scheduler.eos_ids = saved
    engine.check_integrity()
    for before, after in zip(probe, outputs):
        ids = before["token_ids"]
        cut = ids.index(eos) + 1 if eos in ids else len(ids)
        assert after["token_ids"] == ids[:cut]
        assert after["finish_reason"] == ("stop" if eos in ids else "length")
    assert outputs[0]["completion_tokens"] <= 6


def test_hooks_fire_once_per_step_with_cuda_graphs():
    """Graph replays run no Python, so every hook point sits on the scheduler side: with graphs
    on, each step still fires each of its hooks exactly once."""
    from collections import Counter

    from workbench import Workbench

    wb = Workbench(
        MODEL, num_pages=kv_pages(), max_running_reqs=16, cuda_graph_max_bs=16, overlap=True
    )
    assert wb.engine.graphs is not None and wb.engine.graphs.capture
    fired = Counter()
    wb.hooks.add("*", lambda e: fired.update([(type(e).__name__, getattr(e, "step", None))]))
    for prompt in random_prompts(8, 8, 64, seed=6):
        wb.add_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    records = wb.run(progress=False)
    decode = [r for r in records if r.phase == "decode"]
    assert decode and all(r.cuda_graph for r in decode)
    for r in records:
        for name in ("ScheduleEnd", "BatchPrepared", "ForwardBegin", "ForwardEnd", "SampleEnd"):
            assert fired[(name, r.step)] == 1, (name, r.step)
    assert fired[("RequestFinish", records[-1].step)] >= 1
    wb.check_integrity()


def test_abort_with_overlap_and_cuda_graphs():
    """An aborted request's pages are freed only once the replay that writes its KV is collected;
    the others run to exactly max_tokens and the pool balances."""
    from workbench import Workbench

    wb = Workbench(
        MODEL, num_pages=kv_pages(), max_running_reqs=16, cuda_graph_max_bs=16, overlap=True
    )
    uids = [
        wb.add_request(p, SamplingParams(max_tokens=20, ignore_eos=True))
        for p in random_prompts(8, 8, 64, seed=7)
    ]
    wb.step(4)
    victim = uids[3]
    assert any(r.uid == victim for r in wb.scheduler.in_flight.batch.reqs)
    partial = wb.abort(victim)
    wb.run(progress=False)
    wb.check_integrity()
    outputs = {o["uid"]: o for o in wb.outputs()}
    assert outputs[victim]["finish_reason"] == "abort" and partial["completion_tokens"] < 20
    assert all(outputs[u]["completion_tokens"] == 20 for u in uids if u != victim)


def test_a_chunk_step_waits_for_the_device_in_its_wait_stage():
    """A prompt's chunk samples nothing, so there are no tokens to wait for; its record reads
    the step's device time, and that wait belongs to the step's "wait", not to its recording.
    Counted as recording (0.9 ms a chunk of 64 of Qwen3-0.6B on the H200, against 0.06 ms for
    the record of any other step), it made every device-bound chunk step look host-bound."""
    engine = make_llm(overlap=True, max_extend_tokens=64, record="light")
    engine.generate(random_prompts(4, 600, 900, seed=9), SamplingParams(max_tokens=4))
    steps = engine.history.steps
    chunk = (steps.sampled == 0) & (steps.phase != "decode")
    assert chunk.sum() >= 20, "the prompts should run in chunks of 64"
    chunks, others = steps.host_record_ms[chunk], steps.host_record_ms[~chunk]
    print(
        f"\nrecord stage: chunk steps {chunks.median():.3f} ms, others {others.median():.3f} ms;"
        f" chunk steps' wait {steps.wait_ms[chunk].median():.3f} ms"
    )
    assert chunks.median() <= 2 * others.median() + 0.05
    engine.check_integrity()
