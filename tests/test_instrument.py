"""Instrumentation: hook points, step records and the run history tell the truth."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from workbench import LLM, SamplingParams, Workbench, load_run
from workbench.instrument import HOOK_POINTS, HookError
from workbench.kvcache.radix import RadixCache
from workbench.kvcache.table import TableManager
from workbench.scheduler.cache import CacheManager
from workbench.scheduler.prefill import PendingReq, PrefillAdder

from .conftest import PROMPTS, greedy

LONG = PROMPTS[3] * 4  # about 100 tokens: several chunks under a small budget


def sharing_workload(wb: Workbench) -> list[int]:
    """A long chunked prompt, two prompts sharing a prefix with it, short ones behind."""
    uids = [wb.add_request(LONG, greedy(6))]
    uids += [wb.add_request(LONG[:200] + " and then", greedy(5)) for _ in range(2)]
    uids += [wb.add_request(p, greedy(4)) for p in PROMPTS[:3]]
    uids.append(wb.add_request(PROMPTS[4], greedy(3), arrival_step=6))
    return uids


@pytest.fixture()
def wb() -> Workbench:
    return Workbench("tiny-llama", max_extend_tokens=24, num_pages=260, max_running_reqs=4)


def test_ledger_rows_are_the_engines_own_lengths(wb):
    seen = {}  # (step, uid) -> the request object's lengths, read by a hook after the forward

    def copy(event):
        for r in event.ledger:
            seen[(event.step, r.uid)] = (r.cached_len, r.device_len, r.max_device_len, r.table_idx)

    wb.hooks.add("forward.end", copy)
    sharing_workload(wb)
    wb.run(progress=False)
    wb.check_integrity()
    ledger = wb.history.ledger
    assert len(ledger) == len(seen) > 30
    assert (ledger.cached_len >= 0).all()
    assert (ledger.cached_len < ledger.device_len).all()
    assert (ledger.device_len <= ledger.max_device_len).all()
    for row in ledger.itertuples():
        assert seen[(row.step, row.uid)] == (
            row.cached_len,
            row.device_len,
            row.max_device_len,
            row.table_idx,
        )
    assert {"chunk", "prefill", "decode"} <= set(ledger.kind)
    assert (wb.history.requests.cached_tokens > 0).any()  # the shared prefix was served
    reasons = set(wb.history.admissions.reason.dropna())
    assert {"no_token_budget", "kv_full"} & reasons


def test_prefill_extend_and_cached_tokens_add_up_to_the_prompts(wb):
    uids = sharing_workload(wb)
    wb.run(progress=False)
    ledger, requests = wb.history.ledger, wb.history.requests.set_index("uid")
    computed = ledger[ledger.kind != "decode"].groupby("uid").extend_len.sum()
    for uid in uids:
        req = requests.loc[uid]
        assert computed[uid] + req.cached_tokens == req.prompt_tokens
    assert computed.sum() == sum(r.num_tokens for r in wb.history.records if r.phase == "prefill")
    assert (requests.completion_tokens == requests.max_tokens).all()


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (dict(max_running_reqs=1), "no_slot"),
        (dict(max_extend_tokens=4), "no_token_budget"),
        (dict(num_pages=40), "kv_full"),
    ],
)
def test_crafted_situations_give_their_reasons(options, reason):
    wb = Workbench("tiny-llama", **options)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(12))
    wb.run(progress=False)
    admissions = wb.history.admissions
    assert reason in set(admissions.reason)
    refused = admissions[admissions.reason == reason]
    assert (~refused.admitted).all() and (refused.extend_len == 0).all()


def test_kv_full_after_lock_when_locking_shrinks_what_can_be_evicted():
    """The fourth check: a request fits while its matched prefix counts as evictable, and no
    longer once it is locked."""
    ps = 1
    cache = CacheManager(num_pages=100, page_size=ps, prefix_cache=RadixCache(ps))
    table = TableManager(4, 128, torch.device("cpu"))
    prefix = list(range(1, 41))
    pages = cache.allocate_pages(40)
    cache.release(prefix, 40, pages.astype(np.int32), cache.match(prefix).handle)
    assert cache.free_size == 60 and cache.evictable_size == 40
    pending = PendingReq(0, prefix[:39] + [99, 98], SamplingParams(max_tokens=20))
    # needs 41 + 20 - 39 = 22 tokens; before locking 100 are available, after it 61
    adder = PrefillAdder(token_budget=100, reserved_size=50, cache=cache, table=table)
    assert adder.try_add_one(pending) == "kv_full_after_lock"
    assert cache.evictable_size == 40  # the lock was undone
    adder = PrefillAdder(token_budget=100, reserved_size=30, cache=cache, table=table)
    assert adder.try_add_one(pending).cached_len == 39


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
    assert len(HOOK_POINTS) == 13


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


def test_save_and_load_give_equal_tables(tmp_path):
    wb = Workbench("tiny-llama", record="full", max_extend_tokens=16)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(4))
    records = wb.run(progress=False)
    assert records[0].page_rows and records[0].events
    assert len(wb.history.events) > 100
    assert {"hook", "cpu_op"} <= set(wb.history.events.category)
    path = wb.save(tmp_path / "run.json")
    run = load_run(path)
    for name in ("steps", "ledger", "requests", "admissions", "events"):
        pd.testing.assert_frame_equal(getattr(wb.history, name), getattr(run, name))
    assert run.meta["model"] == "tiny-llama" and run.meta["record"] == "full"
    trace = json.loads(wb.export_trace(tmp_path / "trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"forward.end", "schedule.end", "step 0 prefill"} <= names
    assert all(e["ph"] in ("X", "M") for e in trace["traceEvents"])


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


def test_record_renders_as_html_and_pandas():
    wb = Workbench("tiny-llama", max_extend_tokens=8)
    wb.add_request(LONG, greedy(2))
    wb.add_request(PROMPTS[0], greedy(2))
    record = wb.step()
    html = record._repr_html_()
    assert "<table" in html and "chunk" in html and "<script" not in html
    frame = record.to_pandas()
    assert list(frame.uid) == [r.uid for r in record.rows]
    assert record.phase == "prefill" and record.num_tokens == 8


@pytest.mark.parametrize("overlap", [False, True])
def test_step_times_split_into_host_and_waiting(overlap):
    wb = Workbench("tiny-llama", max_extend_tokens=24, overlap=overlap)
    for p in PROMPTS:
        wb.add_request(p, greedy(6))
    wb.run(progress=False)
    steps = wb.history.steps
    # on the CPU the forward runs on the host, inside launch: host time covers device time, the
    # step's wall time covers both, and collect finds the tokens already there
    assert (steps.host_ms >= steps.device_ms).all()
    assert (steps.wall_ms + 1e-3 >= steps.host_ms).all()
    assert (steps.wait_ms >= 0).all() and steps.wait_ms.max() < 0.1 * steps.host_ms.min()


def test_records_keep_nothing_per_request_that_the_garbage_collector_tracks(wb):
    """A long run's history must not grow the collector's work: a full collection walks every
    tracked object, and per-request named tuples stay tracked for ever (H200: 0.3 s per run)."""
    import gc

    sharing_workload(wb)
    wb.run(progress=False)
    gc.collect()
    gc.collect()  # a container is examined before its members in a pass: untracked in the next
    records = list(wb.history)
    assert sum(r.size for r in records) > 30 and any(r.admissions for r in records)
    tracked = [
        part
        for r in records
        for part in (r._launched, *r._launched, r._admissions, *r._admissions, r._finishes)
        if gc.is_tracked(part)
    ]
    assert tracked == []
    # and what they rebuild is the same ledger as the tables
    assert sum(r.size for r in records) == len(wb.history.ledger)
    assert sum(len(r.admissions) for r in records) == len(wb.history.admissions)


def test_every_waiting_request_has_a_decision_at_every_step():
    """The requests behind the first refusal are kept as a slice of the queue, not as decisions;
    the record, the table and the `reject` hook still give each of them its row, in queue order."""
    wb = Workbench("tiny-llama", max_running_reqs=2)
    uids = [wb.add_request(p, greedy(3)) for p in PROMPTS[:6]]
    rejected = []
    wb.hooks.add("reject", lambda e: rejected.append((e.step, e.uid, e.reason)))
    records = wb.run(progress=False)
    first = records[0]
    assert [(a.uid, a.admitted, a.reason) for a in first.admissions] == [
        (uids[0], True, None),
        (uids[1], True, None),
        (uids[2], False, "no_slot"),
        *((uid, False, "queued_behind") for uid in uids[3:]),
    ]
    table = wb.history.admissions
    assert table.groupby("step").size().tolist() == [
        len(r.admissions) for r in records if len(r.admissions)
    ]
    assert sorted(rejected) == sorted(
        (r.step, a.uid, a.reason) for r in records for a in r.admissions if not a.admitted
    )
    # every step a request waited, it has exactly one decision
    waits = table[~table.admitted]
    assert not waits.duplicated(["step", "uid"]).any()
    assert set(waits.reason) == {"no_slot", "queued_behind"}


def test_tables_built_step_by_step_equal_tables_built_at_once(wb):
    """A live history adds only the new records to its tables; the result must be what a
    build from all the records gives, also after the records start over."""
    from workbench.instrument.history import TABLES, _build_tables

    sharing_workload(wb)
    history = wb.history
    while wb.step(3) is not None:
        history.ledger  # noqa: B018 (builds the tables so far)
        whole = _build_tables(history.records, history.arrivals, history.aborts)
        for name in TABLES:
            pd.testing.assert_frame_equal(history.tables()[name], whole[name], check_exact=True)
    assert len(history.ledger) > 30
    history.records.clear()
    assert history.steps.empty and history.ledger.empty
