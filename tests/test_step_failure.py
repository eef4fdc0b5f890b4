"""A step is all or nothing: when anything raises inside it, the requests of its batch end with
finish_reason "error", what they held is freed (with overlap, once the batch in flight that
still uses it completes), the caller gets a StepError naming them, and the same engine goes on
serving. Faults are injected at each stage of a step, with overlap off and on, on the CPU and
(with `pytest -m gpu`) on the GPU. The planted induction model gives every run's exact answer.
"""

from __future__ import annotations

import random

import pytest

from workbench import SamplingParams, StepError, Workbench
from workbench.models.induction import pattern_continuation, pattern_prompts

from .conftest import CPU_AND_GPU, INDUCTION

DEVICES = CPU_AND_GPU
_workbenches: dict[str, Workbench] = {}


class InjectedFault(RuntimeError):
    pass


@pytest.fixture(scope="module", autouse=True)
def _free_workbenches():
    yield
    _workbenches.clear()


def workbench(device: str, **settings) -> Workbench:
    if device not in _workbenches:
        _workbenches[device] = Workbench(
            INDUCTION[device],
            device=device,
            num_pages=4096,
            max_running_reqs=8,
            cuda_graph_max_bs=8,
        )
    wb = _workbenches[device]
    wb.reset()
    wb.reconfigure(**settings)
    return wb


def inject(monkeypatch, wb: Workbench, stage: str, at: int, error=InjectedFault) -> None:
    """Raise `error` the `at`-th time the stage runs: after allocating (prepare), instead of
    the forward or the sampling (`Engine.sample`: with CUDA graphs the sampler runs inside the
    graph), or once the sampled tokens are appended on the host, before any request ends
    (collect)."""
    calls = [0]

    def wrap(fn, before: bool):
        def faulty(*args, **kwargs):
            calls[0] += 1
            if calls[0] == at and before:
                raise error(f"{stage} fault")
            out = fn(*args, **kwargs)
            if calls[0] == at:
                raise error(f"{stage} fault")
            return out

        return faulty

    if stage == "prepare":
        cache = wb.scheduler.cache
        monkeypatch.setattr(cache, "allocate", wrap(cache.allocate, before=False))
    elif stage == "forward":
        monkeypatch.setattr(wb.engine, "forward", wrap(wb.engine.forward, before=True))
    elif stage == "sample":
        monkeypatch.setattr(wb.engine, "sample", wrap(wb.engine.sample, before=True))
    else:
        sched = wb.scheduler
        monkeypatch.setattr(sched, "_append_tokens", wrap(sched._append_tokens, before=False))


def submit(wb: Workbench, seed: int) -> dict[int, list[int]]:
    rng = random.Random(seed)
    prompts = [pattern_prompts(rng, [rng.randint(14, 60)], rng.randint(3, 9))[0] for _ in range(4)]
    prompts += pattern_prompts(rng, [90], period=13)  # chunked under a budget of 24
    arrivals = [0, 0, 1, 2, 3]
    return {
        wb.add_request(p, SamplingParams(max_tokens=10, ignore_eos=True), arrival_step=a): p
        for p, a in zip(prompts, arrivals)
    }


def finish_the_rest(wb: Workbench, prompts: dict[int, list[int]], n: int) -> dict[int, dict]:
    """Run what is left, then: the pool is clean, every request has ended, by its length or
    an error, with tokens that begin its pattern's continuation of `n` tokens. The outputs."""
    wb.run(progress=False)
    wb.check_integrity()
    outputs = {o["uid"]: o for o in wb.outputs()}
    assert set(outputs) == set(prompts)
    for uid, prompt in prompts.items():
        got = outputs[uid]["token_ids"]
        assert outputs[uid]["finish_reason"] in ("length", "error")
        assert got == pattern_continuation(prompt, n)[: len(got)]
    return outputs


@pytest.mark.parametrize("at", [4, 9])  # early: chunks in flight; later: decodes
@pytest.mark.parametrize("stage", ["prepare", "forward", "sample", "collect"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_a_step_that_fails_ends_its_batch_and_frees_it(device, overlap, stage, at, monkeypatch):
    wb = workbench(device, overlap=overlap, max_extend_tokens=24)
    prompts = submit(wb, seed=at)
    inject(monkeypatch, wb, stage, at=at)
    with pytest.raises(StepError, match=f"{stage} fault") as info:
        wb.run(progress=False)
    error = info.value
    assert error.stage == stage and error.uids
    assert set(error.uids) <= set(prompts)
    assert isinstance(error.__cause__, InjectedFault)
    wb.check_integrity()  # right away; with overlap a batch may still be in flight
    failed = {o["uid"]: o for o in wb.outputs() if o["finish_reason"] == "error"}
    assert set(failed) == set(error.uids)
    assert all("InjectedFault: " + stage in o["error"] for o in failed.values())

    monkeypatch.undo()  # the fault is gone: the others finish, exactly
    wb.run(progress=False)
    wb.check_integrity()
    outputs = {o["uid"]: o for o in wb.outputs()}
    assert set(outputs) == set(prompts)
    for uid, prompt in prompts.items():
        got, want = outputs[uid]["token_ids"], pattern_continuation(prompt, 10)
        if uid in failed:
            assert outputs[uid]["finish_reason"] == "error" and got == want[: len(got)]
        else:
            assert outputs[uid]["finish_reason"] == "length" and got == want
    requests = wb.history.requests.set_index("uid")
    assert (requests.loc[list(failed), "finish_reason"] == "error").all()

    fresh = submit(wb, seed=99)  # the same engine serves the next requests
    wb.run(progress=False)
    wb.check_integrity()
    outputs = {o["uid"]: o for o in wb.outputs()}
    assert all(outputs[u]["token_ids"] == pattern_continuation(p, 10) for u, p in fresh.items())


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_an_interrupt_inside_a_step_frees_its_batch_too(device, overlap, monkeypatch):
    """Ctrl-C in a notebook while a step runs: the KeyboardInterrupt reaches the caller as it
    is, and the batch it hit is freed like a failed one."""
    wb = workbench(device, overlap=overlap, max_extend_tokens=24)
    prompts = submit(wb, seed=7)
    inject(monkeypatch, wb, "forward", at=3, error=KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        wb.run(progress=False)
    wb.check_integrity()
    monkeypatch.undo()
    outputs = finish_the_rest(wb, prompts, 10)
    assert sum(o["finish_reason"] == "error" for o in outputs.values()) >= 1


@pytest.mark.parametrize("device", DEVICES)
def test_generate_after_a_failed_step_leaves_nothing_behind(device, monkeypatch):
    """LLM.generate is all or nothing for the whole call: a failed step ends every request of
    the call (the batch's with "error", the rest aborted), and nothing is left in the engine."""
    wb = workbench(device, overlap=True, max_extend_tokens=24)
    llm = wb.llm
    rng = random.Random(3)
    prompts = [pattern_prompts(rng, [rng.randint(14, 60)], 5)[0] for _ in range(5)]
    inject(monkeypatch, wb, "sample", at=3)
    with pytest.raises(StepError):
        llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert llm.scheduler.is_idle and not llm.scheduler.finished
    llm.check_integrity()
    monkeypatch.undo()
    out = llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert [o["token_ids"] for o in out] == [pattern_continuation(p, 8) for p in prompts]
    llm.check_integrity()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_an_interrupt_in_a_finish_hook_loses_no_request(device, overlap):
    """Ctrl-C while a `request.finish` hook runs, in a step where several requests end: each
    request that step ended keeps its ending (none is left with a reason but never finished),
    and the engine serves on."""
    wb = workbench(device, overlap=overlap, max_extend_tokens=256)
    rng = random.Random(5)
    prompts = pattern_prompts(rng, [20, 24, 28, 32], 5)
    uids = [wb.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True)) for p in prompts]
    calls = []

    def interrupt(event):
        calls.append(event.uid)
        if len(calls) == 1:
            raise KeyboardInterrupt

    handle = wb.hooks.add("request.finish", interrupt)
    with pytest.raises(KeyboardInterrupt):
        wb.run(progress=False)
    handle.remove()
    wb.check_integrity()
    outputs = finish_the_rest(wb, dict(zip(uids, prompts)), 6)
    assert sum(o["finish_reason"] == "length" for o in outputs.values()) >= 2  # ended together
