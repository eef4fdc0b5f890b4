"""Profiling runs and comparing schedules on one engine: a profiler session per run (or per window
of steps) whose events land in the steps that caused them, page-table snapshots as slot runs,
`compare` over named settings, `max_running_reqs` changed live, and `close()`."""

from __future__ import annotations

import gzip
import json
import os
import random
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from workbench import LLM, SamplingParams, Workbench
from workbench.core import ReqView
from workbench.history.pages import pages_at
from workbench.history.tables import PageRow
from workbench.instrument.pages import PageSnapshots
from workbench.instrument.profiler import HOOK_RANGES, RANGE_MARKS
from workbench.kvcache.table import TableManager
from workbench.models.induction import pattern_continuation, pattern_prompts
from workbench.profiling import assign_to_steps, read_events
from workbench.viz import compare_table

from .conftest import CPU_AND_GPU, INDUCTION

STEP_RANGES = ("schedule.end", "batch.prepared", "forward.end", "sample.end", "step.end")


def workbench(device: str, **options) -> Workbench:
    return Workbench(
        INDUCTION[device],
        device=device,
        num_pages=4096,
        max_running_reqs=8,
        cuda_graph_max_bs=8,
        **options,
    )


def submit(wb: Workbench, seed: int = 0, count: int = 5) -> dict[int, list[int]]:
    rng = random.Random(seed)
    prompts = pattern_prompts(rng, [rng.randint(20, 70) for _ in range(count)], period=7)
    return {
        wb.add_request(p, SamplingParams(max_tokens=8, ignore_eos=True), arrival_step=i): p
        for i, p in enumerate(prompts)
    }


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_each_profiled_step_gets_its_own_ranges_and_kernels(device, overlap):
    """One session over the run; afterwards every step holds exactly one range of each hook
    point it went through (with overlap, the next batch's launch runs inside this step's
    scheduler call, and its ranges still go to the next step), and on a GPU its kernels."""
    with workbench(device, record="full", overlap=overlap, max_extend_tokens=24) as wb:
        prompts = submit(wb)
        records = wb.run(progress=False)
        assert all(r.events is not None for r in records)
        events = wb.history.events
        for step, group in events[events.category == "hook"].groupby("step"):
            assert Counter(group.name) == Counter(STEP_RANGES), step
        assert set(events.step) == {r.step for r in records}
        if device == "cuda":
            kernels = events[events.category == "kernel"]
            assert set(kernels.step) == {r.step for r in records}
            # a decode step that replays a graph holds that replay's kernels, whole: steps of one
            # batch size hold as many (by the kernels' own times, overlap cut them in two)
            steps = wb.history.steps.set_index("step")
            copies = kernels.name.str.startswith(("Memcpy", "Memset"))
            sizes: dict[int, list[int]] = {}
            for step, n in kernels[~copies].groupby("step").size().items():
                row = steps.loc[step]
                if row.phase == "decode" and row.cuda_graph:
                    sizes.setdefault(int(row.batch_size), []).append(int(n))
            assert any(len(counts) > 1 for counts in sizes.values()), sizes
            assert all(len(set(counts)) == 1 for counts in sizes.values()), sizes
        outputs = {o["uid"]: o["token_ids"] for o in wb.outputs()}
        assert outputs == {u: pattern_continuation(p, 8) for u, p in prompts.items()}
        wb.check_integrity()


class RecordedEvent:
    """A kineto event as torch 2.11 gave it on an H100 (no `activity_type`), from the
    recording; with `kinds`, as torch 2.13 gives it (its kind too)."""

    def __init__(self, row: list, kinds: bool) -> None:
        self.row = row
        if kinds:
            self.activity_type = self._kind

    def _kind(self) -> str:
        name, cuda = self.row[0], self.row[5]
        if cuda:
            return "kernel"
        if name.startswith("cuda"):
            return "cuda_runtime"
        if name.startswith("cu") and name[2:3].isupper():
            return "cuda_driver"
        return "user_annotation" if name in HOOK_RANGES else "cpu_op"

    def name(self) -> str:
        return self.row[0]

    def start_ns(self) -> int:
        return self.row[1]

    def duration_ns(self) -> int:
        return self.row[2]

    def correlation_id(self) -> int:
        return self.row[3]

    def linked_correlation_id(self) -> int:
        return self.row[4]

    def device_type(self):
        return torch.autograd.DeviceType.CUDA if self.row[5] else torch.autograd.DeviceType.CPU

    def device_index(self) -> int:
        return 0

    def device_resource_id(self) -> int:
        return self.row[6]

    def start_thread_id(self) -> int:
        return 1


@pytest.mark.parametrize("kinds", [False, True], ids=["torch-2.11", "with-kinds"])
def test_recorded_gpu_kernels_go_to_the_step_that_launched_them(kinds):
    """A real session from an H100 (tests/data/h100_decode_window_events.json.gz: decode steps
    of 256 requests replaying CUDA graphs, overlap on): every kernel goes to the step whose
    graph launch it belongs to, so each step holds one whole replay, its kernels back to back.
    By the kernels' own times alone (how it was done), a step's device work, which runs on
    while the host launches the next step, is cut in two at that launch."""
    path = os.path.join(os.path.dirname(__file__), "data", "h100_decode_window_events.json.gz")
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    marks = [tuple(m) for m in doc["marks"]]
    events = [RecordedEvent(r, kinds) for r in doc["events"]]
    capture = read_events(events, doc["offset_us"], HOOK_RANGES)
    assert len(capture.launches) > 0

    def steps(launches):
        by_step = assign_to_steps(capture.events, marks, RANGE_MARKS, launches)
        out = {}
        for step, events in by_step.items():
            kernels = sorted((e for e in events if e[1] == "kernel"), key=lambda e: e[3])
            if kernels:
                reach = np.maximum.accumulate([e[3] + e[4] for e in kernels])
                gaps = np.array([e[3] for e in kernels[1:]]) - reach[:-1]
                out[step] = (Counter(e[0] for e in kernels), gaps.max())
        return out

    linked = steps(capture.launches)
    replays = [linked[s] for s in sorted(linked)[1:]]  # the window's first step starts it
    assert len(replays) >= 10
    assert all(kernels == replays[0][0] for kernels, _ in replays)
    assert sum(replays[0][0].values()) > 250
    assert max(gap for _, gap in replays) < 50.0  # us, in steps of about 7,600
    by_time = steps(None)
    assert max(gap for _, gap in by_time.values()) > 5_000.0


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_profile_steps_limits_the_profiler_to_a_window(device, overlap):
    with workbench(device, record="full", profile_steps=range(3, 6), overlap=overlap) as wb:
        submit(wb)
        records = wb.run(progress=False)
        profiled = {r.step for r in records if r.events is not None}
        assert profiled == {3, 4, 5}
        assert set(wb.history.events.step) == profiled
        assert all(r.events for r in records if r.step in profiled)
        assert len(wb.history.pages) > 0  # page snapshots are kept for every step

        wb.reset()
        wb.reconfigure(profile_steps=range(0, 100, 4))  # every 4th step
        submit(wb, seed=1)
        records = wb.run(progress=False)
        profiled = {r.step for r in records if r.events is not None}
        assert profiled == {r.step for r in records if r.step % 4 == 0}
        events = wb.history.events
        for step, group in events[events.category == "hook"].groupby("step"):
            assert Counter(group.name) == Counter(STEP_RANGES), step  # launch and collect
        if device == "cuda":
            # each window's stop tears CUPTI down (the unprofiled steps between run without
            # it), and the next window brings it back with the CUDA graphs still replaying
            assert os.environ.get("TEARDOWN_CUPTI") == "1"
            kernels = events[events.category == "kernel"]
            assert set(kernels.step) == profiled


def test_profile_steps_is_checked():
    with pytest.raises(TypeError, match="profile_steps"):
        Workbench("tiny-llama", record="full", profile_steps=10)
    with pytest.raises(ValueError, match="profile_steps"):
        Workbench("tiny-llama", record="full", profile_steps=[1, -2])


@pytest.mark.parametrize("overlap", [False, True])
def test_stepping_by_hand_gives_each_step_its_events(overlap):
    """Each `wb.step()` is a profiler session of its own; with overlap a step's batch was
    launched in the call before, and its launch's events still reach its record."""
    with workbench("cpu", record="full", overlap=overlap) as wb:
        submit(wb)
        for _ in range(6):
            record = wb.step()
            names = Counter(e[0] for e in record.events if e[1] == "hook")
            assert names == Counter(STEP_RANGES), record.step


def naive_runs(slots: list[int]) -> list[tuple[int, int, int]]:
    runs = []
    for pos, slot in enumerate(slots):
        if runs and slot == runs[-1][2] + (runs[-1][1] - runs[-1][0]):
            runs[-1] = (runs[-1][0], pos + 1, runs[-1][2])
        else:
            runs.append((pos, pos + 1, slot))
    return runs


def test_page_snapshots_equal_the_rows_they_summarise_as_rows_grow_and_change():
    """Snapshots read only what a row gained since the last one; after rows grow (decode),
    get new pages elsewhere, are rewritten (a prefix swapped for the cache's) or change hands,
    each snapshot still equals the runs of the row's whole contents."""
    rng = np.random.default_rng(0)
    table = TableManager(6, 64, torch.device("cpu"))
    lengths = {row: int(rng.integers(1, 20)) for row in range(5)}
    uids = dict(enumerate(range(5)))
    next_slot = 0
    for row, n in lengths.items():
        table.write_row(row, 0, np.arange(next_slot, next_slot + n, dtype=np.int32))
        next_slot += n + int(rng.integers(0, 3))
    snapshots, gained = PageSnapshots(), []
    for step in range(40):
        rows = [ReqView(uids[r], "decode", r, n - 1, n, 64, 1, 0) for r, n in lengths.items()]
        taken = snapshots.take(table, rows, step)
        for r in rows:
            since, runs = taken[r.table_idx]
            gained += [(step, r.uid, r.table_idx, *run, since) for run in runs]
            if since < step:  # a row that went on gained one position: one run, not the row
                assert len(runs) == 1, (step, r, runs)
        pages = pd.DataFrame(gained, columns=PageRow._fields)
        whole = pages_at(pages, step)
        for r in rows:
            got = whole[whole.table_idx == r.table_idx]
            assert set(got.uid) == {r.uid}
            assert list(zip(got.pos_start, got.pos_end, got.slot_start)) == naive_runs(
                table.page_table_host[r.table_idx, : r.device_len].tolist()
            ), (step, r)
        for row in lengths:  # grow: the next slot, often contiguous, sometimes a new page
            if lengths[row] >= 63:
                continue
            slot = int(table.page_table_host[row, lengths[row] - 1]) + 1
            if rng.random() < 0.2:
                slot, next_slot = next_slot, next_slot + 1
            cols = np.array([lengths[row]])
            table.write_slots(np.array([row]), cols, np.array([slot], dtype=np.int32))
            lengths[row] += 1
        if step % 7 == 3:  # a prefix swapped for other slots
            table.write_row(1, 0, np.arange(500, 504, dtype=np.int32))
        if step % 11 == 5:  # the row changes hands: a new request, shorter
            uids[2] += 100
            lengths[2] = 3
            table.write_slots(np.array([2, 2, 2]), np.arange(3), np.arange(900, 903))


def test_compare_runs_named_settings_on_one_engine():
    with workbench("cpu", record="light") as wb:
        prompts = submit(wb, count=6)
        engine = wb.engine
        settings = {
            "chunk 16": dict(max_extend_tokens=16),
            "chunk 64, mixed": dict(max_extend_tokens=64, policy="mixed"),
            "2 running": dict(max_running_reqs=2, policy="decode_first"),
        }
        runs = wb.compare(settings, progress=False)
        assert list(runs) == list(settings) and wb.engine is engine
        answers = {name: run.meta["texts"] for name, run in runs.items()}
        assert all(a == answers["chunk 16"] for a in answers.values())
        assert runs["2 running"].steps.batch_size.max() <= 2
        assert (runs["2 running"].admissions.reason == "no_slot").any()
        assert runs["chunk 16"].steps.num_tokens.max() <= 16
        assert runs["chunk 64, mixed"].meta["policy"] == "mixed"
        assert len(runs["chunk 16"].requests) == len(prompts)
        # a bad setting is refused before anything runs
        before = len(wb.history)
        with pytest.raises(ValueError, match="max_running_reqs"):
            wb.compare({"ok": {}, "too many": dict(max_running_reqs=9)}, progress=False)
        with pytest.raises(ValueError, match="engine"):
            wb.compare({"page": dict(page_size=16)}, progress=False)
        with pytest.raises(ValueError, match="settings is empty"):  # (it ran nothing, kept nothing)
            wb.compare({}, progress=False)
        assert len(wb.history) == before
        # compare ended in a new run: a request added now is that run's whole workload, and a
        # reconfigure starts a new run as reset does (the run before's requests are not added in)
        wb.add_request(prompts[0], SamplingParams(max_tokens=2))
        assert len(wb.compare({"one": {}}, progress=False)["one"].requests) == 1
        wb.add_request(prompts[1], SamplingParams(max_tokens=2))
        wb.run(progress=False)
        wb.reconfigure(max_extend_tokens=32)
        wb.add_request(prompts[2], SamplingParams(max_tokens=2))
        assert wb.submitted_count == 1
        assert len(wb.compare({"two": {}}, progress=False)["two"].requests) == 1


def test_a_closed_engine_refuses_work():
    llm = LLM("tiny-llama", max_running_reqs=4)
    llm.generate(["Hello"], SamplingParams(max_tokens=2))
    llm.close()
    llm.close()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(["Hello"], SamplingParams(max_tokens=2))
    with Workbench("tiny-llama") as wb:
        wb.add_request("Hello", SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="closed"):
        wb.step()
    for check in (llm.check_integrity, wb.check_integrity):  # said as the rest, not AttributeError
        with pytest.raises(RuntimeError, match="this LLM was closed"):
            check()


def test_requests_arrive_at_times_on_the_runs_clock():
    """Arrival times: an idle engine waits for the next request, whose TTFT counts from when it
    arrived; `compare` serves a timed workload under each setting alike."""
    with workbench("cpu", record="light") as wb:
        rng = random.Random(1)
        prompts = pattern_prompts(rng, [30, 40, 50], period=7)
        sampling = SamplingParams(max_tokens=4, ignore_eos=True)
        times = [0.0, 0.4, 0.8]
        requests = [(p, sampling, t) for p, t in zip(prompts, times)]
        runs = wb.compare(
            {"chunk 8": dict(max_extend_tokens=8), "chunk 64": dict(max_extend_tokens=64)},
            requests,
            progress=False,
            arrival="time",
        )
        for run in runs.values():
            arrived = run.requests.sort_values("uid").arrival_s.tolist()
            assert all(a >= t for a, t in zip(arrived, times))
            assert arrived[-1] < times[-1] + 0.5  # served as it came, not after a long wait
            assert run.steps.completed_at.max() >= times[-1]
        assert runs["chunk 8"].meta["texts"] == runs["chunk 64"].meta["texts"]
        # again by hand: reset(again=True) keeps the times
        uids = wb.reset(again=True)
        assert len(uids) == 3 and not wb.is_done
        wb.run(progress=False)
        assert wb.history.requests.arrival_s.max() >= times[-1]
        with pytest.raises(ValueError, match="arrival_step or arrival_time"):
            wb.add_request(prompts[0], sampling, arrival_step=3, arrival_time=1.0)
        with pytest.raises(ValueError, match=r"requests\[1\] arrival time"):
            wb.compare(
                {"x": {}},
                [(prompts[0], sampling, 0.0), (prompts[1], sampling, -1.0)],
                progress=False,
                arrival="time",
            )
        with pytest.raises(ValueError, match="arrival"):
            wb.compare({"x": {}}, requests, progress=False, arrival="minutes")


def test_a_gpu_profiler_lets_cupti_go_when_it_stops_unless_told_otherwise(monkeypatch):
    """Kineto keeps CUPTI's callbacks after a session unless TEARDOWN_CUPTI=1, and every CUDA
    call after a profiled window pays for them (a decode graph's launch 10x slower on the H200):
    a GPU profiler of ours asks for the teardown; a user's own setting stands."""
    from workbench.profiling import activities

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    activities(torch.device("cpu"))
    assert "TEARDOWN_CUPTI" not in os.environ  # nothing to let go on a CPU
    activities(torch.device("cuda"))
    assert os.environ["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    activities(torch.device("cuda"))
    assert os.environ["TEARDOWN_CUPTI"] == "0"


def test_a_window_chosen_by_predicate_counts_its_session_start_in_its_first_step():
    """A predicate chooses a step once it is scheduled, so the profiler starts inside that
    step: its start is host time the profiler added to the step (`profiler_ms`), on top of
    the per-event estimate that the step after it also carries."""
    from workbench.profiling import session_seconds

    window = lambda s: s.phase == "decode" and 6 <= s.step < 9  # noqa: E731
    with workbench("cpu", record="full", profile_steps=window) as wb:
        submit(wb)
        began = session_seconds()["start"]
        wb.run(progress=False)
        start_ms = (session_seconds()["start"] - began) * 1e3
        steps = wb.history.steps.set_index("step")
        first, second = steps.profiler_ms[6], steps.profiler_ms[7]
        assert list(steps.index[steps.profiled]) == [6, 7, 8]
        assert first - second >= 0.8 * start_ms > 0, (first, second, start_ms)


@pytest.mark.parametrize(
    "window",
    [lambda s: s.phase == "decode" and 6 <= s.step < 9, range(6, 9)],
    ids=["predicate", "steps"],
)
def test_the_step_a_window_ends_in_carries_what_stopping_the_profiler_took(window):
    """A window's session ends in the first step after it, before that step's launch (when it
    is scheduled, for a predicate; as it begins, for steps named): the step is not profiled,
    but its `profiler_ms` is the host time the stop took (kineto's stop is long on a GPU), and
    the other steps outside the window have none."""
    from workbench.profiling import session_seconds

    with workbench("cpu", record="full", profile_steps=window) as wb:
        submit(wb)
        began = session_seconds()["stop"]
        wb.run(progress=False)
        stop_ms = (session_seconds()["stop"] - began) * 1e3
        steps = wb.history.steps.set_index("step")
        assert list(steps.index[steps.profiled]) == [6, 7, 8]
        assert not steps.profiled[9] and steps.profiler_ms[9] >= stop_ms > 0
        if callable(window):  # (a predicate's stops while the step is scheduled)
            assert steps.profiler_ms[9] <= steps.host_schedule_ms[9]
        others = steps.drop(index=[6, 7, 8, 9])
        assert others.profiler_ms.isna().all()
        table = compare_table({"run": wb.history}, full=True)
        per_step = table.loc["run", "profiler ms per profiled step"]
        assert per_step == pytest.approx(steps.profiler_ms.sum() / 3, abs=1e-3)
