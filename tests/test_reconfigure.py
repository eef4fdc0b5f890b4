"""One engine, many schedules: `reconfigure` changes the scheduler's settings only."""

from __future__ import annotations

import pytest

from workbench import SamplingParams, Workbench

from .conftest import PROMPTS, greedy, hf_greedy


def test_reconfigure_keeps_the_engine_and_changes_the_schedule():
    wb = Workbench("tiny-qwen3", max_running_reqs=4)
    engine, pool, table = wb.engine, wb.engine.pool, wb.engine.table
    seen = []
    wb.hooks.add("step.end", lambda record: seen.append(record.phase))
    ids = [wb.llm.encode(p) for p in PROMPTS]
    expected = hf_greedy("tiny-qwen3", ids, 10)
    for policy, budget, cache in (("prefill_first", 8192, "radix"), ("mixed", 5, "naive")):
        wb.reconfigure(policy=policy, max_extend_tokens=budget, cache=cache, overlap=True)
        assert wb.step_index == 0 and wb.history.steps.empty  # a new run
        for p in ids:
            wb.add_request(p, greedy(10))
        records = wb.run(progress=False)
        wb.check_integrity()
        assert [o["token_ids"] for o in wb.outputs()] == expected
        assert max(r.num_tokens for r in records) <= budget
        assert wb.config.policy == policy and wb.scheduler.cache.shares == (cache == "radix")
        assert wb.scheduler.overlap
    assert "mixed" in seen  # the hook stayed through both
    assert wb.engine is engine and engine.pool is pool and engine.table is table


def test_reconfigure_refuses_engine_settings_and_busy_engines():
    wb = Workbench("tiny-llama", max_running_reqs=2)
    with pytest.raises(ValueError, match=r"\['page_size'\] belong to the engine"):
        wb.reconfigure(page_size=4)
    with pytest.raises(ValueError, match="policy must be one of"):
        wb.reconfigure(policy="fastest")
    with pytest.raises(ValueError, match="record must be one of"):
        wb.reconfigure(record="everything")
    uid = wb.add_request(PROMPTS[0], SamplingParams(max_tokens=4))
    with pytest.raises(RuntimeError, match="idle"):
        wb.reconfigure(max_extend_tokens=8)
    wb.abort(uid)
    wb.add_request(PROMPTS[1], SamplingParams(max_tokens=4), arrival_step=5)
    with pytest.raises(RuntimeError, match="due to arrive"):
        wb.reconfigure(max_extend_tokens=8)
    wb.run(progress=False)
    wb.reconfigure(max_extend_tokens=8, record="off")
    assert wb.config.max_extend_tokens == 8 and wb.llm.record == "off"
