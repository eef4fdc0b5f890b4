"""The Workbench driver: it generates what LLM does, run_until, late arrivals and reset."""

from __future__ import annotations

import pytest

from workbench import LLM, Workbench

from .conftest import PROMPTS, greedy


@pytest.mark.parametrize("overlap", [False, True])
def test_workbench_generates_what_llm_generates(overlap):
    params = [greedy(n) for n in (3, 7, 5, 1, 9)]
    expected = LLM("tiny-qwen3", max_extend_tokens=16, overlap=overlap).generate(PROMPTS, params)
    wb = Workbench("tiny-qwen3", max_extend_tokens=16, overlap=overlap)
    for p, sp in zip(PROMPTS, params):
        wb.add_request(p, sp)
    records = wb.run(progress=False)
    assert wb.is_done
    assert wb.outputs() == expected
    # each token is attributed to the step that computed it, overlap or not
    ledger = wb.history.ledger
    for out in wb.outputs():
        mine = ledger[(ledger.uid == out["uid"]) & ledger.token.notna()].sort_values("step")
        assert mine.token.tolist() == out["token_ids"]
    assert any(r.overlapped for r in records) == overlap


def test_run_until_is_a_conditional_breakpoint_and_arrivals_wait():
    wb = Workbench("tiny-llama", max_running_reqs=2)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(6))
    late = wb.add_request(PROMPTS[4], greedy(2), arrival_step=9)
    record = wb.run_until(lambda r: 2 in r.uids)  # when does the third request get in?
    assert record is not None and 2 in record.uids
    assert any(a.uid == 2 and a.admitted for a in record.admissions)
    earlier = wb.history.admissions[wb.history.admissions.step < record.step]
    assert set(earlier[earlier.uid == 2].reason) == {"no_slot"}
    wb.run(progress=False)
    requests = wb.history.requests.set_index("uid")
    assert requests.loc[late].arrival_step == 9
    assert requests.loc[late].first_scheduled_step >= 9
    assert (requests.ttft_s > 0).all() and requests.finish_reason.notna().all()


def test_reset_leaves_a_clean_engine():
    wb = Workbench("tiny-llama", max_extend_tokens=8)
    for p in PROMPTS:
        wb.add_request(p, greedy(20))
    wb.step(4)
    wb.reset()
    assert wb.is_done and len(wb.history) == 0 and wb.step_index == 0
    assert wb.scheduler.cache.free_size == wb.scheduler.cache.total_size
    wb.add_request(PROMPTS[0], greedy(3))
    assert len(wb.run(progress=False)) == 3


def test_a_cpu_engine_takes_half_the_cores_unless_told(monkeypatch):
    """docs/engine.md, "The CPU path under load": one thread per two cores (at least one), or
    `cpu_threads`, or what OMP_NUM_THREADS says."""
    import os

    import torch

    from workbench import LLM

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        LLM("tiny-llama", max_running_reqs=1, num_pages=64).close()
        assert torch.get_num_threads() == max(1, (os.cpu_count() or 1) // 2)
        LLM("tiny-llama", max_running_reqs=1, num_pages=64, cpu_threads=3).close()
        assert torch.get_num_threads() == 3
        torch.set_num_threads(2)
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        LLM("tiny-llama", max_running_reqs=1, num_pages=64).close()
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError, match="cpu_threads must be"):
            LLM("tiny-llama", cpu_threads=0)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("driver", ["llm", "workbench"])
def test_close_frees_every_tensor_of_the_engine_without_a_garbage_collection(driver):
    """On the CPU `close()` runs no collection (0.4 s where a process holds many objects): what
    the engine held (weights, KV pool, page table) must be freed as it is dropped, so nothing it
    made may sit in a reference cycle. The settings with callbacks and probes: record="full",
    the prefix cache, overlap."""
    import gc
    import weakref

    import torch

    from workbench import SamplingParams

    def tensors() -> dict[int, torch.Tensor]:
        return {id(o): o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)}

    gc.collect()
    before = set(tensors())
    gc.disable()
    try:
        options = dict(record="full", num_pages=256, overlap=True)
        if driver == "llm":
            made = LLM("tiny-llama", **options)
            made.generate(PROMPTS, SamplingParams(max_tokens=6))
        else:
            made = Workbench("tiny-llama", **options)
            for prompt in PROMPTS:
                made.add_request(prompt, SamplingParams(max_tokens=6))
            made.run(progress=False)
            assert made.history.ledger.token.notna().any()  # (the records read while it lived)
        engine = [weakref.ref(t) for i, t in tensors().items() if i not in before]
        assert len(engine) > 10  # the weights, the KV pool, the page table among them
        made.close()
        del made
        alive = [tuple(t().shape) for t in engine if t() is not None]
    finally:
        gc.enable()
    assert alive == []
