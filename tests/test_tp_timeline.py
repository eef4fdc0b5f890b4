"""One timeline for all ranks: with tensor parallelism and record="full", every rank's profiler
events of every profiled step, their clocks aligned on rank 0's at the all-reduces, each step's
skew (how late the latest rank came), a Chrome trace with a process per rank, the skew chart,
and all of it through a save. On the CPU, two gloo processes."""

from __future__ import annotations

import json
import math
import time
import types

import pandas as pd
import pytest

from workbench import Workbench, load_run, viz
from workbench.history.rank_clock import align_steps
from workbench.history.rank_skew import all_reduce_times, step_skew
from workbench.history.trace import chrome_trace
from workbench.viz.charts import BY_NAME

from .conftest import greedy

MODEL = "tiny-qwen3"  # 3 layers: 7 all-reduces a step (embedding, then o and down per layer)
PROMPTS = [[5, 17, 33, 2, 91, 4, 4, 8, 120, 7], [9, 9, 9, 14], list(range(100, 121))]
FORWARD_OPS = {"aten::mm", "aten::scaled_dot_product_attention", "gloo:all_reduce"}


@pytest.fixture(scope="module")
def wb2():
    wb = Workbench(MODEL, device="cpu", tp_size=2, max_running_reqs=8, max_extend_tokens=12)
    yield wb
    wb.close()


@pytest.fixture(scope="module")
def profiled(wb2, tmp_path_factory):
    """A run of chunked prompts and decodes, every step profiled: its tables, where rank 0's
    run clock began on this host's monotonic clock, and its exported trace."""
    wb2.reset()
    wb2.reconfigure(record="full", profile_steps=None)
    for p in PROMPTS:
        wb2.add_request(p, greedy(5))
    wb2.run(progress=False)
    origin = time.perf_counter() - wb2.llm.scheduler.clock.now()
    trace = json.loads(wb2.export_trace(tmp_path_factory.mktemp("trace") / "t.json").read_text())
    return wb2.snapshot(), origin, trace


def test_every_rank_records_every_profiled_step(profiled):
    run, _, _ = profiled
    steps, events = run.steps, run.events
    assert steps.profiled.all() and len(steps) > 4
    for rank in (0, 1):
        names = {step: set(n) for step, n in events[events["rank"] == rank].groupby("step").name}
        assert list(names) == steps.step.tolist()
        assert all(step_names >= FORWARD_OPS for step_names in names.values())
    counts = all_reduce_times(events).groupby(["step", "rank"]).size().unstack()
    assert (counts[0] == counts[1]).all() and (counts[0] == 7).all()


def test_rank_clocks_are_aligned_at_the_all_reduces(profiled):
    """Both ranks run on this host: rank 1 records on its monotonic clock, which rank 0's run
    clock counts from `origin`, so the true offset is known. Each step's offset is within 1 ms of
    it, and after alignment no rank ends an all-reduce before the other has begun it."""
    run, origin, _ = profiled
    steps = run.steps
    assert (steps.clock_offset_ms_rank1 + origin * 1e3).abs().max() < 1.0
    times = all_reduce_times(run.events)
    starts = times.pivot_table(index=["step", "k"], columns="rank", values="start_us")
    ends = times.pivot_table(index=["step", "k"], columns="rank", values="end_us")
    assert (starts.max(axis=1) <= ends.min(axis=1) + 1e-2).all()


def test_steps_table_says_each_steps_skew_and_latest_rank(profiled):
    """Checked by hand against the aligned starts of each step's all-reduces: two ranks, so at
    each all-reduce one of them is late by the gap between their starts."""
    run, _, _ = profiled
    steps, times = run.steps.set_index("step"), all_reduce_times(run.events)
    assert (steps.rank_skew_ms >= 0).all() and set(steps.latest_rank) <= {0, 1}
    for step, rows in times.groupby("step"):
        start = {rank: r.start_us.tolist() for rank, r in rows.groupby("rank")}
        gaps = [b - a for a, b in zip(start[0], start[1])]  # > 0: rank 1 came later
        assert steps.rank_skew_ms[step] == pytest.approx(sum(map(abs, gaps)) / 1e3, abs=1e-5)
        late = sum(g for g in gaps if g > 0) / 1e3
        assert steps.late_ms_rank1[step] == pytest.approx(late, abs=1e-5)
        later = sum(g > 0 for g in gaps)
        if later != len(gaps) - later:
            assert steps.latest_rank[step] == int(later > len(gaps) / 2)


def test_the_trace_has_a_process_per_rank(profiled):
    run, _, trace = profiled
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert processes == {0: "rank 0", 1: "rank 1"}
    threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in spans} <= threads
    for rank in (0, 1):
        assert {e["name"] for e in spans if e["pid"] == rank} >= FORWARD_OPS
    step0 = next(e for e in spans if e["name"].startswith("step 0 "))
    assert step0["pid"] == 0 and step0["args"]["latest_rank"] in (0, 1)
    assert step0["args"]["rank_skew_ms"] == pytest.approx(run.steps.rank_skew_ms[0])
    assert "all-reduce" in trace["otherData"]["clock_alignment"]
    assert math.isfinite(trace["otherData"]["all_reduce_end_gap_us"])


def test_the_skew_chart_draws_each_steps_skew_by_latest_rank(profiled, tmp_path):
    run, _, _ = profiled
    spec = viz.rank_skew(run, highlight_step=2).to_dict()
    (rows,) = [v for v in spec["datasets"].values() if v and "rank_skew_ms" in v[0]]
    assert [r["rank_skew_ms"] for r in rows] == pytest.approx(run.steps.rank_skew_ms.tolist())
    assert [r["latest"] for r in rows] == [f"rank {r}" for r in run.steps.latest_rank]
    encoding = spec["layer"][0]["encoding"]
    assert encoding["color"]["field"] == "latest"
    # each bar rises from zero (a bar from x to x2 without y2 is drawn as a line at its value)
    assert encoding["y2"] == {"datum": 0} and encoding["x2"] == {"field": "bin_end"}
    assert BY_NAME["rank_skew"].applies(run)
    loaded = load_run(run.save(tmp_path / "run.parquet"))
    assert viz.rank_skew(loaded, highlight_step=2).to_dict() == spec


def test_a_saved_run_keeps_every_ranks_events_and_the_skew(profiled, tmp_path):
    run, _, _ = profiled
    loaded = load_run(run.save(tmp_path / "run.parquet"))
    for name in ("steps", "events"):
        pd.testing.assert_frame_equal(getattr(run, name), getattr(loaded, name))
    assert chrome_trace(loaded.steps, loaded.events) == chrome_trace(run.steps, run.events)


def test_an_older_run_without_ranks_still_exports_and_hides_the_chart(profiled):
    """A run saved before the `rank` column and the skew columns: one process, no skew."""
    run, _, _ = profiled
    steps = run.steps.drop(columns=[c for c in run.steps if "skew" in c or "rank" in c])
    events = run.events[run.events["rank"] == 0].drop(columns="rank")
    trace = chrome_trace(steps, events)
    assert {e["pid"] for e in trace["traceEvents"]} == {0}
    assert "clock_alignment" not in trace["otherData"]
    old = type(run)({**run.tables(), "steps": steps, "events": events}, run.meta)
    assert not BY_NAME["rank_skew"].applies(old)
    assert "no skew" in json.dumps(viz.rank_skew(old).to_dict())


def test_a_run_looked_at_after_another_keeps_its_ranks_events(wb2, profiled):
    """`generate` leaves the events to the first look at its history; a reconfigure in between
    (which ends the first run: its events are read then) leaves each run its own ranks'."""
    llm = wb2.llm
    llm.reconfigure(record="full", profile_steps=None)
    llm.generate(PROMPTS[:2], greedy(3))
    first = llm.history
    llm.reconfigure(max_extend_tokens=6)
    llm.generate(PROMPTS[:2], greedy(3))
    for history in (llm.history, first):
        events, steps = history.events, history.steps
        assert sorted(set(events.step[events["rank"] == 1])) == steps.step.tolist()
        assert steps.device_ms_rank1.notna().all() and steps.rank_skew_ms.notna().all()


def test_with_overlap_stepped_by_hand_every_step_gets_its_ranks_events(wb2, profiled):
    """With overlap a step's batch is still in flight when `step` returns: its record, built
    in the next call, still gets the other rank's events (kept since they were handed over)."""
    wb2.reset()
    wb2.reconfigure(record="full", profile_steps=None, overlap=True)
    for p in PROMPTS:
        wb2.add_request(p, greedy(4))
    wb2.step(3)
    assert wb2.llm.scheduler.in_flight is not None
    wb2.run(progress=False)
    steps, events = wb2.history.steps, wb2.history.events
    assert steps.overlapped.any()
    assert sorted(set(events.step[events["rank"] == 1])) == steps.step.tolist()
    assert steps.rank_skew_ms.notna().all()
    wb2.reconfigure(overlap=False)


def test_only_the_steps_rank_0_profiles_are_profiled_on_every_rank(wb2, profiled):
    """A window of steps: rank 1 profiles exactly those (the step message says so); the other
    steps have no events and no skew. With record="light", no events and no skew columns."""
    wb2.reset()
    wb2.reconfigure(record="full", profile_steps=[1, 3])
    for p in PROMPTS:
        wb2.add_request(p, greedy(4))
    wb2.run(progress=False)
    steps, events = wb2.history.steps, wb2.history.events
    assert steps.step[steps.profiled].tolist() == [1, 3]
    assert sorted(set(events.step[events["rank"] == 1])) == [1, 3]
    assert steps.rank_skew_ms.notna().tolist() == steps.profiled.tolist()
    assert steps.latest_rank.isna().tolist() == (~steps.profiled).tolist()
    wb2.reset()
    wb2.reconfigure(record="light")
    for p in PROMPTS[:2]:
        wb2.add_request(p, greedy(3))
    wb2.run(progress=False)
    assert wb2.history.events.empty and "rank_skew_ms" not in wb2.history.steps


def _all_reduces(pairs):  # (start_us, end_us) per all-reduce, as one rank's events of a step
    return [("gloo:all_reduce", "cpu_op", "cpu:2", s, e - s) for s, e in pairs]


def test_clock_offsets_from_made_up_all_reduces():
    """Rank 1's clock about 5 ms behind rank 0's. Each step's all-reduces bound the offset and
    its neighbours' narrow the bounds (both ways, and from steps aligned before), except those
    that would leave no room; bounds that contradict each other within a step give the median
    of the ends' gaps; a step without all-reduces keeps the last offset, and a rank without one
    yet is left out of its step."""
    two = _all_reduces([(100, 400), (900, 1000)])
    steps = [
        # max(100 + 4600, 900 + 4000) = 4900 <= offset <= min(400 + 4800, 1000 + 4200) = 5200
        (two, [_all_reduces([(-4800, -4600), (-4200, -4000)])]),
        (two, [_all_reduces([(-4900, -4850), (-4300, -4050)])]),  # 4950 .. 5300
        (_all_reduces([(100, 400)]), [_all_reduces([(-6000, -5900)])]),  # 6000 .. 6400: apart
        ([], [[("aten::mm", "cpu_op", "cpu:1", 7.0, 1.0)]]),  # no all-reduce
    ]
    clocks: dict = {}
    aligned = align_steps(steps, clocks)
    assert [ms for _, ms in aligned] == [[5.075], [5.075], [6.2], [6.2]]
    assert [[e[3] for e in events] for _, events in aligned[0][0]] == [[275.0, 875.0]]
    assert aligned[3][0] == [(1, [("aten::mm", "cpu_op", "cpu:1", 6207.0, 1.0)])]
    # a later read: its step's bounds (4900 .. 5400) narrowed by those aligned before
    later = align_steps([(two, [_all_reduces([(-5000, -4600), (-4400, -4000)])])], clocks)
    assert later[0][1] == [5.075]
    moved, ms = align_steps(steps[3:], {})[0]  # no offset known yet
    assert moved == [] and math.isnan(ms[0])
    # bounds 5600 > 4400: paired wrongly; the median of the ends' gaps, 4100 and 5700
    crossed = align_steps([(two, [_all_reduces([(-4000, -3700), (-4950, -4700)])])], {})
    assert crossed[0][1] == [4.9]


def test_skew_from_made_up_all_reduces():
    """Step 0: rank 1 late by 30 us, then rank 0 by 10: a tie of counts, so the later in all,
    rank 1. Step 1: rank 1 late twice by 5 us, rank 0 once by 100: rank 1 came last more often."""
    starts = {0: [(100, 130), (300, 290)], 1: [(0, 5), (10, 15), (120, 20)]}
    rows = [
        (step, rank, "gloo:all_reduce", "cpu_op", "cpu:2", float(at[rank]), 50.0)
        for step, pairs in starts.items()
        for at in pairs
        for rank in (0, 1)
    ]
    columns = ["step", "rank", "name", "category", "track", "start_us", "duration_us"]
    skew = step_skew(pd.DataFrame(rows, columns=columns), 2)
    assert skew.rank_skew_ms.tolist() == pytest.approx([0.04, 0.11])
    assert skew.late_ms_rank0.tolist() == pytest.approx([0.01, 0.1])
    assert skew.late_ms_rank1.tolist() == pytest.approx([0.03, 0.01])
    assert skew.latest_rank.tolist() == [1, 1]


def test_the_skew_chart_bins_a_long_run():
    """More profiled steps than bars: each bin's mean skew, coloured by its most frequent latest
    rank, under Altair's row limit."""
    steps = pd.DataFrame({"step": range(1500)})
    steps["rank_skew_ms"] = steps.step % 3 * 1.0  # 0, 1, 2, 0, 1, 2, ..
    steps["latest_rank"] = pd.array([1 if s % 3 else 0 for s in steps.step], dtype="Int64")
    spec = viz.rank_skew(types.SimpleNamespace(steps=steps)).to_dict()
    (rows,) = [v for v in spec["datasets"].values() if v]
    assert len(rows) <= viz.common.MAX_BARS and rows[0]["bin_end"] - rows[0]["bin"] == 3
    assert {r["rank_skew_ms"] for r in rows} == {1.0} and {r["latest"] for r in rows} == {"rank 1"}
