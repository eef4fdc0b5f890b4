"""Profile windows chosen by what a step is: a predicate of the step about to run (a function of
a `StepView`, or an expression as text) selects exactly the steps it should under every policy,
with chunked prompts and with overlap; only those run under the profiler; a capped window keeps
the first N; the saved run and the trace say which steps were profiled and what chose them; a bad
predicate is refused, naming it, before anything is built."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections import Counter

import pytest
import torch

import workbench.llm
from workbench import SamplingParams, Workbench, load_run
from workbench.__main__ import main
from workbench.instrument.hooks import HookError
from workbench.instrument.window import StepView
from workbench.policies import POLICIES
from workbench.profiling import event_cost_us
from workbench.viz import compare_table

from .conftest import shared

MODEL = "tiny-llama"


def engine() -> Workbench:
    """One engine for the file (each test reconfigures what it needs)."""
    return shared(
        lambda: Workbench(MODEL, record="full", max_extend_tokens=24, max_running_reqs=4),
        "profile windows",
    )


def submit(wb: Workbench, seed: int = 0, count: int = 6) -> None:
    """Prompts of 10-50 tokens (a budget of 24 chunks most) arriving one a step."""
    rng = random.Random(seed)
    for i in range(count):
        ids = [rng.randrange(100, 5000) for _ in range(rng.randint(10, 50))]
        wb.add_request(ids, SamplingParams(max_tokens=6, ignore_eos=True), arrival_step=i)


def selects(s: StepView) -> bool:
    return (
        (s.phase == "mixed" and s.batch_size >= 3)
        or (s.prefill_tokens >= 20 and s.decode_batch == 0)
        or s.step % 5 == 4
    )


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_predicate_profiles_exactly_the_steps_it_selects(policy, overlap):
    wb = engine()
    wb.reset()
    seen: list[StepView] = []

    def predicate(s: StepView) -> bool:
        seen.append(s)
        return selects(s)

    wb.reconfigure(policy=policy, overlap=overlap, profile_steps=predicate, max_profiled_steps=None)
    seen.clear()  # (it was tried once on a made-up step)
    submit(wb)
    profiler_on = {}
    watch = {
        "forward.begin": lambda e: profiler_on.update({e.step: torch.autograd._profiler_enabled()})
    }
    with wb.hooks.scoped(watch):
        records = wb.run(progress=False)
    steps = wb.history.steps
    assert (steps.chunk_tokens > 0).any()  # chunked prompts
    # what the predicate saw is each step as it ran
    assert [v.step for v in seen] == steps.step.tolist()
    for v, row in zip(seen, steps.itertuples()):
        composition = (row.phase, row.batch_size, row.prefill_tokens + row.chunk_tokens)
        assert (v.phase, v.batch_size, v.prefill_tokens) == composition
        assert (v.decode_batch, v.num_tokens) == (row.decode_tokens, row.num_tokens)
        assert 0.0 <= v.kv_usage <= 1.0
    chosen = {v.step for v in seen if selects(v)}
    assert 0 < len(chosen) < len(steps)
    assert set(steps.step[steps.profiled]) == chosen
    assert {r.step for r in records if r.events is not None} == chosen
    events = wb.history.events
    assert set(events.step) == chosen
    for step, group in events[events.category == "hook"].groupby("step"):
        names = Counter(group.name)
        assert all(names[n] == 1 for n in ("batch.prepared", "forward.end", "sample.end"))
        if not overlap:  # its schedule too when the session ran on from the step before
            assert names["schedule.end"] == (step - 1 in chosen), step
    on = {step for step, enabled in profiler_on.items() if enabled}
    # the others run with no profiler (what record="light" costs); with overlap, a launch
    # made while a chosen batch is in flight runs inside that batch's session
    assert on == chosen if not overlap else on >= chosen
    wb.check_integrity()


def test_a_capped_window_keeps_the_first_n_it_selects():
    wb = engine()
    wb.reset()
    wb.reconfigure(
        policy="prefill_first",
        overlap=False,
        profile_steps="phase == 'decode'",
        max_profiled_steps=3,
    )
    submit(wb, seed=1)
    wb.run(progress=False)
    steps = wb.history.steps
    decode = steps.step[steps.phase == "decode"].tolist()
    assert len(decode) > 3
    assert steps.step[steps.profiled].tolist() == decode[:3]
    # a window of indices under the same cap (kept when only profile_steps changes)
    wb.reset()
    wb.reconfigure(profile_steps=range(2, 100, 2))
    submit(wb, seed=2)
    wb.run(progress=False)
    steps = wb.history.steps
    assert steps.step[steps.profiled].tolist() == [2, 4, 6]
    assert set(wb.history.events.step) == {2, 4, 6}
    assert wb.llm.run_meta()["max_profiled_steps"] == 3


@pytest.mark.parametrize("suffix", ["parquet", "json"])
def test_the_saved_run_and_the_trace_say_which_steps_were_profiled_and_why(tmp_path, suffix):
    wb = engine()
    wb.reset()
    text = "phase == 'prefill' or decode_batch >= 3"
    wb.reconfigure(policy="mixed", overlap=False, profile_steps=text, max_profiled_steps=None)
    submit(wb, seed=3)
    wb.run(progress=False)
    steps = wb.history.steps
    profiled = steps.step[steps.profiled].tolist()
    assert 0 < len(profiled) < len(steps)
    run = load_run(wb.save(tmp_path / f"run.{suffix}"))
    assert run.steps.step[run.steps.profiled.astype(bool)].tolist() == profiled
    assert run.meta["profile_steps"] == text and run.meta["max_profiled_steps"] is None
    trace = json.loads(wb.export_trace(tmp_path / "trace.json").read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
    assert [int(e["name"].split()[1]) for e in slices if e["args"]["profiled"]] == profiled
    assert trace["otherData"]["profile_steps"] == text
    # a lambda is saved as its source
    wb.reset()
    wb.reconfigure(profile_steps=lambda s: s.batch_size >= 3)
    assert wb.llm.run_meta()["profile_steps"] == "lambda s: s.batch_size >= 3"


def test_each_profiled_step_says_what_the_profiler_added_to_its_host_time(tmp_path):
    """`profiler_ms`: the host events the profiler recorded in the step (kept or not) times what
    one costs, measured when the first session started; NaN for a step not profiled."""
    wb = engine()
    wb.reset()
    wb.reconfigure(
        policy="mixed", overlap=True, profile_steps=range(0, 100, 2), max_profiled_steps=None
    )
    submit(wb, seed=5)
    wb.run(progress=False)
    steps, events = wb.history.steps, wb.history.events
    cost_ms = event_cost_us(torch.device("cpu")) / 1e3
    assert cost_ms > 0  # an operator recorded costs the host something
    profiled = steps[steps.profiled]
    assert len(profiled) and steps.profiler_ms[~steps.profiled].isna().all()
    counts = profiled.profiler_ms / cost_ms  # whole numbers of events
    assert (abs(counts - counts.round()) < 0.01).all() and (counts >= 1).all()
    # at least the host events it kept (hook ranges, longer operators) were counted
    kept = events[events.category != "kernel"].groupby("step").size()
    assert (
        counts.round().astype(int).to_numpy()
        >= kept.reindex(profiled.step, fill_value=0).to_numpy()
    ).all()
    # an estimate (events times a cost measured once), so one step's may pass its measured host
    # time when the machine is busier than at the measurement; over the profiled steps it is a part
    assert profiled.profiler_ms.sum() < profiled.host_ms.sum()
    run = load_run(wb.save(tmp_path / "run.parquet"))
    assert run.steps.profiler_ms.tolist() == pytest.approx(steps.profiler_ms.tolist(), nan_ok=True)
    assert compare_table({"a": run}, full=True).loc["a", "profiler ms per profiled step"] > 0


def test_an_event_cost_read_as_zero_is_measured_again_at_the_next_session(monkeypatch):
    """Two timings of one add, before and after the profiler starts, can meet when the machine's
    speed changes between them: 0 is no measurement (profiler_ms would say the profiler added
    nothing), so the next session measures again."""
    import time

    from workbench.profiling import cost
    from workbench.profiling.session import ProfilerSession

    cpu = torch.device("cpu")
    monkeypatch.setattr(cost, "_EVENT_COST_US", {})  # as in a process before its first session
    with monkeypatch.context() as timed:
        timed.setattr(cost, "_call_us", lambda device, rounds=15: 3.0)  # the two timings met
        session = ProfilerSession(time.perf_counter, cpu)
        session.start()
        session.stop()
    assert math.isnan(event_cost_us(cpu))
    # the next session times the add again (warming, before, after: 2 us more with the profiler);
    # NOTE: timings given, not taken: a real pair met again in one make test on this busy 2-core
    # machine (2026-12-07), and what is checked here is that the next session measures at all
    readings = iter([3.0, 3.0, 5.0])
    monkeypatch.setattr(cost, "_call_us", lambda device, rounds=15: next(readings))
    session = ProfilerSession(time.perf_counter, cpu)
    session.start()
    session.stop()
    assert event_cost_us(cpu) == 2.0
    session = ProfilerSession(time.perf_counter, cpu)  # measured: not again
    session.start()
    session.stop()
    assert event_cost_us(cpu) == 2.0


def test_a_predicate_that_raises_mid_run_is_raised_after_its_step():
    wb = engine()
    wb.reset()
    # (fine on the made-up step it is tried on, of one request; not on a batch of two)
    wb.reconfigure(
        policy="prefill_first", overlap=False, profile_steps=lambda s: 1 // (s.batch_size - 2) > 0
    )
    submit(wb, seed=4)
    with pytest.raises(HookError, match="profile_steps.*ZeroDivisionError"):
        while wb.step() is not None:
            pass
    wb.check_integrity()  # the step ran to its end, unprofiled
    assert not wb.history.steps.profiled.iloc[-1]
    wb.reset()


def _refuse(*_, **__):
    raise AssertionError("an engine was built")


@pytest.mark.parametrize(
    ("steps", "error", "match"),
    [
        (lambda s: s.batchsize > 3, TypeError, "profile_steps.*batchsize.*fields"),
        (lambda a, b: True, TypeError, "profile_steps.*takes one StepView"),
        ("batchsize > 3", ValueError, "profile_steps: unknown name 'batchsize'"),
        ("__import__('os').getcwd()", ValueError, "profile_steps: Call is not allowed"),
        ("batch_size + 1 > 3", ValueError, "profile_steps: BinOp is not allowed"),
        ("phase in ('mixed',)", ValueError, "profile_steps: .* is not allowed"),
        ("phase ==", ValueError, "profile_steps: .* is not an expression"),
        ("phase > 3", TypeError, "profile_steps: .*failed on a StepView"),
        # a phase no step has would choose none, silently
        ("phase == 'mixd'", ValueError, "phase is one of .'prefill', 'decode', 'mixed'., compar"),
        ("'prefil' != phase or batch_size > 3", ValueError, "compared with 'prefil' in"),
        # behind an `and` that a decode step stops at: made-up steps of every phase reach it
        (lambda s: s.phase == "mixed" and s.batchsize > 1, TypeError, "batchsize.*fields"),
        ("phase == 'mixed' and batch_size > 'x'", TypeError, "failed on a StepView"),
        (10, TypeError, "profile_steps must be"),
        ([1, -2], ValueError, "profile_steps item"),
    ],
)
def test_a_bad_predicate_is_refused_naming_it_before_anything_is_built(
    monkeypatch, steps, error, match
):
    monkeypatch.setattr(workbench.llm, "Engine", _refuse)
    with pytest.raises(error, match=match):
        Workbench(MODEL, record="full", profile_steps=steps)


def test_bad_windows_are_refused_by_reconfigure(monkeypatch):
    monkeypatch.setattr(workbench.llm, "Engine", _refuse)
    with pytest.raises(ValueError, match="max_profiled_steps"):
        Workbench(MODEL, record="full", max_profiled_steps=-1)
    monkeypatch.undo()
    wb = engine()
    wb.reset()
    wb.reconfigure(profile_steps="phase == 'mixed'", max_profiled_steps=None)
    with pytest.raises(ValueError, match="unknown name 'size'"):
        wb.reconfigure(profile_steps="size > 1")
    assert wb.llm.run_meta()["profile_steps"] == "phase == 'mixed'"  # unchanged


def test_the_command_line_refuses_a_bad_profile_when_before_it_starts(capsys):
    for flags, said in [
        (["--profile-when", "batchsize > 3"], "--profile-when: unknown name 'batchsize'"),
        (["--profile-when", "phase =="], "--profile-when: 'phase ==' is not an expression"),
        (["--max-profiled-steps", "x"], "--max-profiled-steps"),
    ]:
        with pytest.raises(SystemExit):
            main(["bench", *flags])
        err = capsys.readouterr().err
        assert said in err, err
    with pytest.raises(ValueError, match="--profile-when .*--record full"):
        main(["bench", "--profile-when", "step > 1", "--record", "light"])


def test_bench_profile_when_profiles_the_steps_it_names(tmp_path):
    expression = "phase == 'decode' and batch_size >= 2"
    cmd = (
        [sys.executable, "-m", "workbench", "bench", "--num-requests", "4"]
        + ["--input-len", "8", "24", "--output-len", "4", "12"]
        + ["--profile-when", expression, "--max-profiled-steps", "3", "--save", str(tmp_path)]
    )
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    assert "profiled 3 of " in out and expression in out
    run = load_run(tmp_path / "run.parquet")
    steps = run.steps
    chosen = steps.step[(steps.phase == "decode") & (steps.batch_size >= 2)].tolist()[:3]
    assert steps.step[steps.profiled.astype(bool)].tolist() == chosen
    assert set(run.events.step) == set(chosen)
    assert run.meta["record"] == "full" and run.meta["profile_steps"] == expression


def test_bench_profile_when_writes_a_trace_that_says_which_steps_and_why(tmp_path):
    """--profile-trace with --profile-when: the run's Chrome trace, each step marked profiled or
    not, kernels and operators only in the chosen steps, the rule in its otherData."""
    expression = "phase == 'decode' and batch_size >= 3"
    path = tmp_path / "trace.json"
    cmd = (
        [sys.executable, "-m", "workbench", "bench", "--num-requests", "4"]
        + ["--input-len", "8", "24", "--output-len", "4", "12", "--profile-when", expression]
        + ["--max-profiled-steps", "2", "--profile-trace", str(path)]
    )
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    assert f"Chrome trace of the run written to {path}" in out
    trace = json.loads(path.read_text())
    steps = {
        e["args"]["step"] if "step" in e["args"] else int(e["name"].split()[1]): e
        for e in trace["traceEvents"]
        if e["ph"] == "X" and e["pid"] == 0 and e["tid"] == 0
    }
    profiled = sorted(s for s, e in steps.items() if e["args"]["profiled"])
    chosen = sorted(
        s for s, e in steps.items() if e["cat"] == "decode" and e["args"]["batch_size"] >= 3
    )[:2]
    assert profiled == chosen and len(steps) > len(chosen)
    others = {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] != 0}
    assert others == set(chosen)
    assert trace["otherData"]["profile_steps"] == expression
    assert trace["otherData"]["max_profiled_steps"] == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("overlap", [False, True])
def test_gpu_a_predicate_window_carries_kernels_in_exactly_the_steps_it_chose(tmp_path, overlap):
    """On a GPU, decode steps replayed as CUDA graphs: only the chosen steps carry kernels (each
    of them some), the others run with no profiler session (what "light" costs: without overlap
    none is running at their launch), the trace marks the chosen steps and gives the rule."""
    from .conftest import INDUCTION

    rule = "phase == 'mixed' or (phase == 'decode' and decode_batch >= 3)"
    wb = Workbench(
        INDUCTION["cuda"],
        record="full",
        profile_steps=rule,
        max_profiled_steps=None,
        policy="mixed",
        overlap=overlap,
        max_extend_tokens=64,
        max_running_reqs=4,
        num_pages=4096,
    )
    try:
        submit(wb, seed=6)
        profiler_on = {}
        watch = {
            "forward.begin": lambda e: profiler_on.update(
                {e.step: torch.autograd._profiler_enabled()}
            )
        }
        with wb.hooks.scoped(watch):
            wb.run(progress=False)
        steps, events = wb.history.steps, wb.history.events
        chosen = set(
            steps.step[
                (steps.phase == "mixed") | ((steps.phase == "decode") & (steps.decode_tokens >= 3))
            ]
        )
        assert chosen and len(chosen) < len(steps)
        assert set(steps.step[steps.profiled]) == chosen
        kernels = events[events.category == "kernel"]
        assert set(kernels.step) == chosen  # each chosen step some kernels, the others none
        assert kernels.track.str.startswith("gpu:").all()
        on = {step for step, enabled in profiler_on.items() if enabled}
        assert on == chosen if not overlap else on >= chosen
        trace = json.loads(wb.export_trace(tmp_path / "trace.json").read_text())
        slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
        marked = {int(e["name"].split()[1]) for e in slices if e["args"]["profiled"]}
        assert marked == chosen and trace["otherData"]["profile_steps"] == rule
        wb.check_integrity()
    finally:
        wb.close()
