"""The run history: step records, the ledger and the tables built from them, save and load."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from workbench import Workbench, load_run
from workbench.clocks import HOST_STAGES
from workbench.policies import POLICIES

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


def test_save_and_load_give_equal_tables(tmp_path):
    wb = Workbench("tiny-llama", record="full", max_extend_tokens=16)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(4))
    records = wb.run(progress=False)
    assert records[0].page_rows and records[0].events
    assert len(wb.history.events) > 100
    assert {"hook", "cpu_op"} <= set(wb.history.events.category)
    path = wb.save(tmp_path / "run.parquet")
    run = load_run(path)
    for name in ("steps", "ledger", "requests", "admissions", "events"):
        pd.testing.assert_frame_equal(getattr(wb.history, name), getattr(run, name))
    assert run.meta["model"] == "tiny-llama" and run.meta["record"] == "full"
    trace = json.loads(wb.export_trace(tmp_path / "trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"forward.end", "schedule.end", "step 0 prefill"} <= names
    assert all(e["ph"] in ("X", "M") for e in trace["traceEvents"])


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
    # step's wall time covers both (but for the record, built after the step completed), and
    # collect finds the tokens already there (the median step: a busy machine may preempt the
    # process between launch and collect in any one step)
    assert (steps.host_ms >= steps.device_ms).all()
    assert (steps.wall_ms + steps.host_record_ms + 1e-3 >= steps.host_ms).all()
    assert (steps.wait_ms >= 0).all() and steps.wait_ms.median() < 0.1 * steps.host_ms.median()


@pytest.fixture(scope="module")
def split_wb() -> Workbench:
    return Workbench("tiny-llama", max_extend_tokens=24, record="light")


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_host_time_splits_by_stage_and_the_stages_add_up(split_wb, policy, overlap):
    wb = split_wb
    wb.reset()
    wb.reconfigure(policy=policy, overlap=overlap)
    sharing_workload(wb)
    wb.run(progress=False)
    steps = wb.history.steps
    split = steps[[f"host_{stage}_ms" for stage in HOST_STAGES]]
    assert (split >= 0).all().all()
    # the stage clock and the times measured around launch, collect and record agree
    total = split.sum(axis=1)
    assert ((total - steps.host_ms).abs() <= 0.1 * steps.host_ms).all(), (total, steps.host_ms)
    # every step schedules, prepares, plans, launches, samples (a chunk alone samples nothing,
    # but the stage still runs) and collects; on the CPU the forward runs in its own stage
    for stage in ("schedule", "prepare", "plan", "forward", "sample", "collect", "record"):
        assert (steps[f"host_{stage}_ms"] > 0).all(), stage
    # the device timer runs inside the forward and sample stages (on the CPU it is wall time)
    assert (steps.host_forward_ms + steps.host_sample_ms >= steps.device_ms).all()
    assert steps.host_forward_ms.sum() > 0.5 * steps.host_ms.sum()


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


def test_tables_built_step_by_step_equal_tables_built_at_once(wb):
    """A live history adds only the new records to its tables; the result must be what a
    build from all the records gives, also after the records start over."""
    from workbench.history.history import TABLES, _build_tables

    sharing_workload(wb)
    history = wb.history
    while wb.step(3) is not None:
        history.ledger  # noqa: B018 (builds the tables so far)
        whole = _build_tables(history.records, history.arrivals, history.aborts, history.roofline)
        for name in TABLES:
            pd.testing.assert_frame_equal(history.tables()[name], whole[name], check_exact=True)
    assert len(history.ledger) > 30
    history.records.clear()
    assert history.steps.empty and history.ledger.empty
