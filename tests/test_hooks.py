"""Hook points: the order they fire in, globs, the registry, raising and scoped hooks."""

from __future__ import annotations

import pytest

from workbench import LLM, Workbench
from workbench.instrument import HOOK_POINTS, HookError

from .conftest import PROMPTS, greedy


def test_hook_order_for_two_requests_is_as_documented():
    wb = Workbench("tiny-llama")
    order = []
    wb.hooks.add("*", lambda e: order.append((type(e).__name__, getattr(e, "uid", None))))
    wb.add_request([1, 2, 3, 4, 5], greedy(2))
    wb.add_request([6, 7, 8], greedy(1))
    wb.run(progress=False)
    assert order == [
        ("RequestArrive", 0),
        ("RequestArrive", 1),
        # step 0: both prompts prefilled
        ("CacheMatch", 0),
        ("CacheMatch", 1),
        ("Admit", 0),
        ("Admit", 1),
        ("ScheduleEnd", None),
        ("BatchPrepared", None),
        ("ForwardBegin", None),
        ("ForwardEnd", None),
        ("CacheInsert", 0),
        ("CacheInsert", 1),
        ("SampleEnd", None),
        ("RequestFinish", 1),  # max_tokens=1: done after its prefill
        ("CacheInsert", 1),
        ("StepRecord", None),
        # step 1: request 0 decodes its second token
        ("ScheduleEnd", None),
        ("BatchPrepared", None),
        ("ForwardBegin", None),
        ("ForwardEnd", None),
        ("SampleEnd", None),
        ("RequestFinish", 0),
        ("CacheInsert", 0),
        ("StepRecord", None),
    ]


def test_every_hook_point_fires_and_globs_match():
    wb = Workbench("tiny-llama", num_pages=60, max_extend_tokens=16)
    fired = set()
    handle = wb.hooks.add("*", lambda e: fired.add(type(e).__name__))
    cache_events = []
    wb.hooks.add("cache.*", cache_events.append)
    for p in PROMPTS:
        wb.add_request(p, greedy(8))
    wb.run(progress=False)
    assert fired == {
        "RequestArrive",
        "CacheMatch",
        "Admit",
        "Reject",
        "ScheduleEnd",
        "BatchPrepared",
        "ForwardBegin",
        "ForwardEnd",
        "SampleEnd",
        "RequestFinish",
        "CacheInsert",
        "CacheEvict",
        "StepRecord",
    }
    assert {type(e).__name__ for e in cache_events} == {"CacheMatch", "CacheInsert", "CacheEvict"}
    handle.remove()
    assert "admit" not in wb.hooks and "cache.match" in wb.hooks
    with pytest.raises(ValueError, match="no hook point matches"):
        wb.hooks.add("forward.middle", print)
    # not a function: refused where it is added, not at the next step's hook point
    with pytest.raises(TypeError, match="fn must be a function of the hook point's event, got"):
        wb.hooks.add("step.end", "print")
    # nor one that cannot take the event, nor a pattern that is not a name
    with pytest.raises(TypeError, match=r"fn must be a function of one argument .* is \(\)"):
        wb.hooks.add("step.end", lambda: 1)
    with pytest.raises(TypeError, match="pattern must be a hook point's name"):
        wb.hooks.add(3, print)
    with pytest.raises(TypeError, match="hooks must be a mapping"), wb.hooks.scoped([("admit", 1)]):
        pass
    scoped = {"step.end": print, "nothing.here": print}
    with pytest.raises(ValueError, match="no hook point matches"), wb.hooks.scoped(scoped):
        pass  # (and none of them stays)
    wb.add_request(PROMPTS[0], greedy(2))
    steps = wb.step_index
    with pytest.raises(TypeError, match="predicate must be a function of one argument"):
        wb.run_until(lambda: True)  # (before a step: it took one, then raised)
    assert "step.end" not in wb.hooks and wb.step_index == steps
    wb.run(progress=False)
    wb.check_integrity()
    assert len(HOOK_POINTS) == 14  # and moe.route, an MoE model's only: test_moe_routing.py


def test_a_raising_hook_completes_the_step_then_raises():
    wb = Workbench("tiny-llama")
    reference = LLM("tiny-llama").generate(PROMPTS[:2], greedy(5))
    for p in PROMPTS[:2]:
        wb.add_request(p, greedy(5))
    calls = []

    def bad(event):
        calls.append(event.step)
        raise KeyError("boom")

    handle = wb.hooks.add("forward.end", bad)
    after = []
    wb.hooks.add("step.end", after.append)  # later hooks in the same step still run
    with pytest.raises(HookError, match="boom") as info:
        wb.step()
    assert isinstance(info.value.__cause__, KeyError)
    assert len(wb.history) == 1 and len(after) == 1  # the step completed and was recorded
    handle.remove()
    wb.run(progress=False)
    wb.check_integrity()
    assert [o["token_ids"] for o in wb.outputs()] == [o["token_ids"] for o in reference]


def test_scoped_hooks_are_removed_on_exit_and_on_error():
    wb = Workbench("tiny-llama")
    with wb.hooks.scoped({"admit": print, "step.end": print}):
        assert "admit" in wb.hooks
    assert "admit" not in wb.hooks and "step.end" not in wb.hooks
    with pytest.raises(RuntimeError), wb.hooks.scoped({"reject": print}):
        raise RuntimeError
    assert "reject" not in wb.hooks
