"""A comparison the user can trust: nothing measured is a first use, winners are named only
beyond the noise, host-bound has one definition that every view reads, and the output reads as
what the data shows. Figures are worked out here, by hand or from runs of known times (a twin
whose costs are twice another's; host work added by a hook in chosen steps)."""

from __future__ import annotations

import html
import json
import re
import time
from dataclasses import replace

import pandas as pd
import pytest

from workbench import LLM, SamplingParams, Workbench
from workbench.scheduler.record import StepRecords
from workbench.twin.costs import Linear
from workbench.viz import compare_summary, compare_table, step_times
from workbench.viz.compare_summary import verdict
from workbench.viz.report import write_report

from .conftest import greedy
from .test_twin import MODEL as TWIN_MODEL
from .test_twin import synthetic_costs


def test_an_engine_takes_every_path_once_before_its_first_measured_step():
    llm = LLM("tiny-qwen3", record="light", max_running_reqs=4)
    warm = llm.warmup
    assert {"prefill", "chunk", "decode", "mixed"} <= warm.paths  # every phase and a chunk
    assert {"greedy", "random", "top-k/top-p"} <= warm.paths  # every sampling path
    assert llm.engine.launches == warm.steps > 0  # the forwards ran before anything measured
    assert len(llm.history) == 0 and llm.scheduler.step_index == 0
    assert llm.run_meta()["warmup_ms"] == round(warm.ms, 1) > 0
    llm.scheduler.check_integrity()  # the warm-up's requests freed, its prefix cache emptied
    # and it leaves nothing in what comes after: the same tokens as an engine without one,
    # seeded random sampling included
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11]]
    sampling = [greedy(6), SamplingParams(max_tokens=6, temperature=0.9, seed=3, ignore_eos=True)]
    cold = LLM("tiny-qwen3", max_running_reqs=4, warmup=False)
    assert cold.warmup is None and cold.engine.launches == 0
    ours, theirs = llm.generate(prompts, sampling), cold.generate(prompts, sampling)
    assert [o["token_ids"] for o in ours] == [o["token_ids"] for o in theirs]
    llm.close()
    cold.close()


def test_a_warm_up_fits_an_engine_too_small_for_its_prompts():
    """A context of 12 tokens and a pool of 16: the warm-up shrinks its prompts to fit."""
    llm = LLM("tiny-qwen3", max_seq_len=12, num_pages=16, max_running_reqs=2)
    assert llm.warmup.steps > 0
    llm.scheduler.check_integrity()
    assert llm.generate([[5, 6, 7]], greedy(3))[0]["completion_tokens"] == 3


def test_compare_runs_its_settings_in_rounds():
    wb = Workbench("tiny-qwen3", max_running_reqs=4)
    budgets: list[int] = []
    wb.hooks.add("request.arrive", lambda e: budgets.append(wb.config.max_extend_tokens))
    settings = {"a": dict(max_extend_tokens=16), "b": dict(max_extend_tokens=64)}
    runs = wb.compare(settings, [([5, 6, 7] * 10, greedy(3))], progress=False, repeats=3)
    assert budgets == [16, 64, 16, 64, 16, 64]  # a, b, a, b, ...: not a, a, a, b, b, b
    for name in settings:
        repeats = runs[name].repeats
        assert len(repeats) == 3 and repeats[0] is runs[name]
        assert [r.meta["repeat"] for r in repeats] == [0, 1, 2]
        assert all(r.repeats == repeats for r in repeats)
    # the chart draws one run a setting and says which, where the table is their mean
    from workbench.viz import compare_chart

    titles = [panel["title"] for panel in compare_chart(runs).to_dict()["vconcat"]]
    assert all(t.endswith("(the first of each setting's 3 runs)") for t in titles), titles
    single = {name: [run] for name, run in runs.items()}  # (one run a setting)
    assert all("runs)" not in p["title"] for p in compare_chart(single).to_dict()["vconcat"])
    with pytest.raises(ValueError, match="repeats"):
        wb.compare(settings, progress=False, repeats=0)
    wb.close()


def test_each_setting_starts_from_the_workbenchs_settings_not_the_one_before():
    """A setting that names only the chunk size runs under the workbench's policy, record level
    and profile window in every round, whatever the setting before it changed; afterwards the
    workbench has its own settings back (before, round 2's "chunk 16" ran "mixed", profiled)."""
    wb = Workbench("tiny-qwen3", max_running_reqs=4, record="light", policy="prefill_first")
    seen: list[tuple] = []
    wb.hooks.add(
        "request.arrive",
        lambda e: seen.append(
            (wb.config.max_extend_tokens, wb.config.policy, wb.llm.settings()["record"])
        ),
    )
    base = wb.llm.settings()
    settings = {
        "chunk 16": dict(max_extend_tokens=16),
        "mixed, profiled": dict(policy="mixed", record="full", max_running_reqs=2),
    }
    runs = wb.compare(settings, [([5, 6, 7] * 10, greedy(3))] * 3, progress=False, repeats=2)
    per_run = [seen[i] for i in range(0, len(seen), 3)]  # (three requests a run)
    assert (
        per_run
        == [(16, "prefill_first", "light"), (base["max_extend_tokens"], "mixed", "full")] * 2
    )
    for run in runs["chunk 16"].repeats:
        assert run.meta["policy"] == "prefill_first" and run.steps.batch_size.max() == 3
        assert not run.steps.profiled.any()
    assert all(r.steps.batch_size.max() <= 2 for r in runs["mixed, profiled"].repeats)
    assert wb.llm.settings() == base and len(wb.history) == 0  # its own settings, a new run
    # the requests stay the workbench's: run again, under its own settings
    wb.reset(again=True)
    wb.run(progress=False)
    assert wb.history.steps.batch_size.max() == 3
    wb.close()


def test_a_comparison_that_fails_leaves_the_workbench_with_its_settings():
    wb = Workbench("tiny-qwen3", max_running_reqs=4, record="light")
    base = wb.llm.settings()

    def fail(event) -> None:
        if wb.config.policy == "mixed":
            raise RuntimeError("a hook's own bug")

    hook = wb.hooks.add("request.arrive", fail)
    settings = {"a": dict(max_extend_tokens=16), "b": dict(policy="mixed")}
    with pytest.raises(Exception, match="a hook's own bug"):
        wb.compare(settings, [([5, 6, 7] * 4, greedy(3))], progress=False)
    assert wb.llm.settings() == base  # not "b"'s policy
    wb.check_integrity()
    hook.remove()
    assert len(wb.compare(settings, progress=False)) == 2  # and it compares on
    wb.close()


def test_a_comparison_without_records_is_refused_by_name(tmp_path):
    """record='off' keeps no steps: compare refuses it before running anything, and a table of
    such runs names the run (it raised pandas' "operation 'sub' not supported")."""
    wb = Workbench("tiny-qwen3", max_running_reqs=4, record="off")
    work = [([5, 6, 7] * 4, greedy(3))]
    with pytest.raises(ValueError, match="setting 'a' would run with record='off'"):
        wb.compare({"a": dict(max_extend_tokens=8), "b": dict(record="light")}, work)
    assert wb.step_index == 0 and len(wb.history) == 0  # (nothing ran)
    runs = wb.compare({"a": dict(record="light"), "b": dict(record="light")}, work, progress=False)
    assert all(len(run.steps) for run in runs.values())
    wb.reconfigure(record="off")
    wb.reset()
    for request in work:
        wb.add_request(*request)
    wb.run(progress=False)
    with pytest.raises(ValueError, match="run 'off' has no step records .it ran with record='off'"):
        compare_table({"off": wb.snapshot(), "light": runs["a"]})
    with pytest.raises(ValueError, match="run 'off' has no step records"):
        compare_summary({"off": wb.snapshot()})  # (it raised "could not convert string to float")
    with pytest.raises(ValueError, match="the run has no step records"):
        wb.report(tmp_path / "report.html")  # (it raised "operation 'add' not supported")
    assert not (tmp_path / "report.html").exists()
    wb.close()


def test_the_summary_quotes_the_tables_figures_over_every_repeat():
    """A sentence's "N steps of X ms on average" and queue time are the table's figures (the mean
    of a setting's runs), not its first run's."""
    wb = Workbench("tiny-qwen3", max_running_reqs=4, record="light")
    requests = [([5, 6, 7] * 10, greedy(4)), ([8, 9] * 12, greedy(4)), ([3, 4] * 9, greedy(4))]
    settings = {"chunk 8": dict(max_extend_tokens=8), "chunk 64": dict(max_extend_tokens=64)}
    runs = wb.compare(settings, requests, progress=False, repeats=3)
    wb.close()
    table = compare_table(runs)
    said = " ".join(compare_summary(runs))
    quoted = dict(re.findall(r"(chunk \d+),? (?:took )?\d+ steps of (\d+\.\d) ms", said))
    assert set(quoted) == set(settings), said
    for label, ms in quoted.items():
        first = runs[label].steps.wall_ms.mean()
        assert ms == f"{table.loc[label, 'mean step wall (ms)']:.1f}", (label, ms, first)
    queued = re.search(r"chunk 8's queued (\d+\.\d+) s in all", said)
    assert queued and float(queued.group(1)) == pytest.approx(
        table.loc["chunk 8", "queued (s)"], abs=0.006
    )


def test_a_settings_figure_is_the_mean_of_its_repeats_and_its_spread_covers_them():
    wb = Workbench("tiny-qwen3", max_running_reqs=4)
    requests = [([5, 6, 7, 8] * (3 + i), greedy(4), i) for i in range(4)]
    runs = wb.compare({"a": dict(max_extend_tokens=8)}, requests, progress=False, repeats=3)
    table = compare_table(runs)
    assert table.loc["a", "repeats"] == 3
    each = [compare_table({"one": r}).loc["one"] for r in runs["a"].repeats]
    for column in ("output tokens/s", "p50 TTFT (ms)", "p50 ITL (ms)", "mean step wall (ms)"):
        values = [float(row[column]) for row in each]
        assert table.loc["a", column] == pytest.approx(sum(values) / 3)
        assert table.loc["a", f"{column} ±"] >= max(values) - min(values) - 1e-9
    assert table.loc["a", "steps"] == each[0]["steps"]  # the same schedule in every repeat
    wb.close()


def test_repeats_that_agree_by_chance_still_carry_their_steps_noise():
    """Two runs of one schedule whose step times differ but whose means agree: the mean's noise
    is what drawing each step's time from either run gives (every step has a shape of its own
    here, so a bootstrap of one run alone sees none), not the zero range of the two means."""
    from workbench.runs import RunHistory

    wb = Workbench("tiny-qwen3", max_running_reqs=4, max_extend_tokens=16, policy="mixed")
    requests = [([5, 6, 7] * (5 + 3 * i), greedy(3), 2 * i) for i in range(3)]
    (run,) = wb.compare({"a": {}}, requests, progress=False).values()
    wb.close()
    frames = dict(run.tables())
    steps = frames["steps"].copy()
    first, last = steps.index[0], steps.index[-1]
    a, b = steps.at[first, "wall_ms"], steps.at[last, "wall_ms"]
    steps.loc[[first, last], "wall_ms"] = [b, a]  # the same total: the means agree
    again = RunHistory({**frames, "steps": steps}, run.meta)
    table = compare_table({"a": [run, again]})
    assert table.loc["a", "repeats"] == 2
    assert table.loc["a", "mean step wall (ms)"] == pytest.approx(steps.wall_ms.mean(), abs=1e-3)
    # step 0 and the last step each take either time: the mean moves by |a - b| / steps each way
    assert table.loc["a", "mean step wall (ms) ±"] >= 0.9 * abs(a - b) / len(steps)


def test_paused_steps_are_the_prefill_steps_that_left_a_running_request_out():
    """ "N paused the running decodes": the prefill steps in which a request that had its first
    token and went on later is not in the batch, worked out from the ledger (the count once
    missed a step whose prefill also finished a chunked prompt, as notebook 01's step 1)."""
    from workbench.viz.causes import run_causes

    wb = Workbench("tiny-llama", max_extend_tokens=32, max_running_reqs=3, record="light")
    for i, (length, tokens) in enumerate(((29, 16), (30, 32), (11, 16), (14, 24))):
        wb.add_request(list(range(100 * i + 3, 100 * i + 3 + length)), greedy(tokens))
    wb.run(progress=False)
    history = wb.history
    wb.close()
    ledger, r = history.ledger, history.requests.set_index("uid")
    last = ledger.groupby("uid").step.max()
    paused = [
        step
        for step in history.steps.step[history.steps.phase == "prefill"]
        if any(
            r.first_token_step[uid] < step < last[uid]
            and not ((ledger.step == step) & (ledger.uid == uid)).any()
            for uid in r.index
        )
    ]
    assert len(paused) >= 2, paused
    assert run_causes(history).paused_steps == len(paused), (paused, history.steps)


def test_the_summary_counts_one_pause_as_one_time():
    """The inter-token sentence says "1 time", "7 times" (it said "1 times")."""
    from workbench.viz.causes import Causes
    from workbench.viz.compare_summary import _itl_why

    def causes(paused: int) -> Causes:
        return Causes(8, 5.0, {}, paused + 1, paused, 64, 0.5, 0.9, 0, True, 1.0, 0, 4, 1.0)

    said = _itl_why({"a": causes(1), "b": causes(7)}, "a", "b")
    assert "paused the running decodes 1 time with a, 7 with b" in said, said
    said = _itl_why({"a": causes(7), "b": causes(1)}, "a", "b")
    assert "paused the running decodes 7 times with a, 1 with b" in said, said


def test_a_latency_sentence_quotes_every_setting_it_names_and_what_p99_says():
    """Each setting a sentence names comes with its own figure from the table; a latency's
    sentence also gives its p99 verdict (winners beyond the noise, or within it)."""
    wb = Workbench("tiny-qwen3", max_running_reqs=4, record="light")
    requests = [([5, 6, 7] * (4 + 4 * i), greedy(5), i) for i in range(5)]
    settings = {f"chunk {c}": dict(max_extend_tokens=c, policy="mixed") for c in (8, 16, 64)}
    runs = wb.compare(settings, requests, progress=False)
    wb.close()
    table = compare_table(runs)
    said = {s.split(" is ")[0].split(" ties")[0]: s for s in compare_summary(runs)}
    quoted = 0
    for title, q in [("Time to first token", "TTFT"), ("Inter-token latency", "ITL")]:
        for p in ("p50", "p99"):
            column = f"{p} {q} (ms)"
            for label, value, noise in re.findall(
                rf"(chunk \d+) \({p} ([\d.,]+) ± ([\d.,]+) ms\)", said[title]
            ):
                assert float(value.replace(",", "")) == pytest.approx(
                    table.loc[label, column], rel=0.01, abs=0.051
                ), (said[title], label)
                assert float(noise.replace(",", "")) == pytest.approx(
                    table.loc[label, f"{column} ±"], rel=0.01, abs=0.0051
                )
                quoted += 1
        tail = verdict(table[f"p99 {q} (ms)"], table[f"p99 {q} (ms) ±"], higher=False)
        if tail.best:
            assert f"; at p99 it is lowest with {tail.best[0]} (p99 " in said[title], said[title]
        else:
            assert "; at p99 within noise of each other (" in said[title], said[title]
    assert quoted >= 2
    # TTFT in steps as the table counts it: a prompt computed in its arrival step took 1 step
    full = compare_table(runs, full=True)
    steps = re.search(
        r"a first token took ([\d.]+) steps on average with (chunk \d+) \(its arrival step to "
        r"its own, both counted\), ([\d.]+) with (chunk \d+)",
        said["Time to first token"],
    )
    assert steps, said["Time to first token"]
    for value, label in (steps.group(1, 2), steps.group(3, 4)):
        assert float(value) == pytest.approx(full.loc[label, "mean TTFT (steps)"], abs=0.006)
    assert full["mean TTFT (steps)"].min() >= 1.0


def _times(f: Linear, scale: float) -> Linear:
    return Linear(f.features, tuple(c * scale for c in f.coef))


def _twin_runs(scale: float, label: str, requests) -> dict:
    """A twin's run of `requests` under step costs of `scale` times synthetic_costs'."""
    costs = synthetic_costs()
    scaled = replace(
        costs,
        device={path: _times(f, scale) for path, f in costs.device.items()},
        host={
            path: {stage: _times(f, scale) for stage, f in stages.items()}
            for path, stages in costs.host.items()
        },
        between_ms=costs.between_ms * scale,
    )
    twin = Workbench(TWIN_MODEL, step_costs=scaled)
    runs = twin.compare({label: {}}, requests, progress=False)
    twin.close()
    return runs


def test_the_table_says_what_device_means_on_a_cpu_as_the_summary_does():
    """On the CPU the "device" of "device busy (%)" and "host-bound steps" is the forward and
    sampling on the host's cores: the table says so under it (text and HTML), as the summary's
    host-bound sentence does; a twin's runs stand for a GPU's and carry no such note."""
    requests = [([1000 + i] * 12, greedy(4), 0) for i in range(3)]
    wb = Workbench(TWIN_MODEL, record="light")
    runs = wb.compare({"a": {}, "b": {"max_extend_tokens": 8}}, requests, progress=False)
    wb.close()
    table = compare_table(runs)
    meaning = "on the CPU the device's work is the forward and sampling, run on the host's cores"
    assert table.note == f"device busy (%) and host-bound steps: {meaning}"
    assert repr(table).endswith("\n" + table.note)
    assert "<small>device busy (%) and host-bound steps: on the CPU the device&#x27;s" in (
        table._repr_html_()
    )
    assert any(meaning in sentence for sentence in compare_summary(runs))
    assert compare_table(_twin_runs(1.0, "twin", requests)).note is None


def test_a_twice_slower_twin_is_named_the_worst_of_every_figure():
    """Requests of one size, each alone on the engine: every request's latencies are the same
    within a run, so the noise is nil and a 2x gap is beyond it."""
    requests = [([1000 + i] * 40, greedy(8), 12 * i) for i in range(6)]
    runs = {**_twin_runs(1.0, "fast", requests), **_twin_runs(2.0, "slow", requests)}
    table = compare_table(runs)
    # the same schedule at twice the cost: every time doubles (the table rounds to 0.01 ms)
    for column in ("p50 TTFT (ms)", "p50 ITL (ms)", "p50 TPOT (ms)", "mean step wall (ms)"):
        assert table.loc["slow", column] == pytest.approx(2 * table.loc["fast", column], rel=0.01)
    assert table.loc["fast", "output tokens/s"] == pytest.approx(
        2 * table.loc["slow", "output tokens/s"], rel=0.01
    )
    said = compare_summary(runs)
    sentence = {s.split(" is ")[0].split(" ties")[0]: s for s in said}
    assert "Throughput is highest with fast (" in sentence["Throughput"]
    assert "and lowest with slow (" in sentence["Throughput"]
    for title in ("Time to first token", "Inter-token latency", "Time per output token"):
        assert f"{title} is lowest with fast (" in sentence[title], sentence[title]
        assert "and highest with slow (" in sentence[title]
    # the schedules are the same: the cause is the steps' length, not the prompts' steps
    assert "took" in sentence["Throughput"] and "split" not in sentence["Time to first token"]
    # a twin's times are its step costs: they differ by those, not by noise
    schedule = next(s for s in said if s.startswith("Every run took the same steps"))
    assert "the twins' step costs only" in schedule and "noise" not in schedule, schedule


def test_a_tie_of_equal_figures_says_so_rather_than_a_range():
    """A twin is deterministic: one setting under two names gives the same figures, and a tie
    says "in every setting" where it said "118 to 118 ms"."""
    requests = [([1000 + i] * 40, greedy(8), 12 * i) for i in range(3)]
    runs = {**_twin_runs(1.0, "a", requests), **_twin_runs(1.0, "b", requests)}
    said = " ".join(compare_summary(runs))
    assert "ms in every setting" in said and not re.search(r"\b(\S+) to \1 ms", said), said
    # a twin's clock has no machine noise: its figures are judged even where no step's shape ran
    # twice (a one-token prompt decoding: contexts 2 and 3 are shapes of their own)
    one = [([1000], greedy(3), 0)]
    runs = {**_twin_runs(1.0, "a", one), **_twin_runs(2.0, "b", one)}
    said = " ".join(compare_summary(runs))
    assert "not judged" not in said and "highest with a" in said, said


def test_runs_of_one_setting_never_produce_a_winner():
    """Real runs, on a machine whose speed wanders: two names for one setting tie, whatever
    the times say; so do two repeats of a setting against each other's mean."""
    wb = Workbench("tiny-qwen3", max_running_reqs=4)
    requests = [([5, 6, 7, 8] * (3 + i), greedy(5), 2 * i) for i in range(4)]
    same = {"a": dict(max_extend_tokens=16), "a again": dict(max_extend_tokens=16)}
    for repeats in (1, 2):
        runs = wb.compare(same, requests, progress=False, repeats=repeats)
        said = compare_summary(runs)
        figures = [s for s in said if s.startswith(("Throughput", "Time", "Inter-token"))]
        assert len(figures) == 4 and all(" ties within noise (" in s for s in figures), said
        assert any("a and a again are one setting" in s for s in said)
        assert any("Every run took the same steps" in s for s in said)
    # one setting whether written out or left at the workbench's value; another share_threshold
    # is another setting (the run's meta says every scheduler setting)
    written = {"base": {}, "written": dict(max_extend_tokens=wb.config.max_extend_tokens)}
    runs = wb.compare({**written, "share 0": dict(share_threshold=0)}, requests, progress=False)
    said = compare_summary(runs)
    assert any("base and written are one setting" in s for s in said), said
    assert not any("share 0 are one setting" in s for s in said), said
    wb.close()


@pytest.mark.parametrize(
    "values, spreads, expected",
    [
        # 100 against 110: apart when their spreads together (3 + 3) are less than 10 ...
        ({"a": 100.0, "b": 110.0}, {"a": 3.0, "b": 3.0}, (["a"], ["b"], [])),
        # ... and a tie when they are more (5 + 6)
        ({"a": 100.0, "b": 110.0}, {"a": 5.0, "b": 6.0}, ([], [], [])),
        # c within the noise of both ends: neither best nor worst
        ({"a": 100.0, "b": 110.0, "c": 105.0}, {"a": 1, "b": 1, "c": 5}, (["a"], ["b"], ["c"])),
        # d within noise of the best alone: it shares the best place
        ({"a": 100.0, "b": 110.0, "d": 101.0}, {"a": 1, "b": 1, "d": 1}, (["a", "d"], ["b"], [])),
        # a spread not known: no verdict
        ({"a": 100.0, "b": 200.0}, {"a": float("nan"), "b": 1.0}, ([], [], [])),
    ],
)
def test_a_verdict_names_the_best_and_worst_only_beyond_their_spreads(values, spreads, expected):
    judged = verdict(pd.Series(values), pd.Series(spreads), higher=False)
    assert (judged.best, judged.worst, judged.between) == expected


def test_two_runs_of_one_setting_are_never_apart_whatever_their_values():
    values, spreads = pd.Series({"a": 100.0, "b": 200.0}), pd.Series({"a": 1.0, "b": 1.0})
    assert verdict(values, spreads, higher=True, same=[["a", "b"]]).best == []
    assert verdict(values, spreads, higher=True).best == ["b"]


@pytest.fixture(scope="module")
def host_bound_run():
    """SmolLM2 (a forward of about 50-100 ms here, more on a busy machine) with host work added
    to every even step by a hook, three times the longest forward so far: exactly the even
    steps are host-bound."""
    wb = Workbench("smollm2", max_extend_tokens=16, max_running_reqs=4)
    longest = [0.2]  # s: three times the longest forward so far, however busy the machine is

    def slowest(record) -> None:
        longest[0] = max(longest[0], record.device_ms / 1e3)

    wb.hooks.add("step.end", slowest)
    wb.hooks.add(
        "batch.prepared", lambda e: time.sleep(3 * longest[0]) if e.step % 2 == 0 else None
    )
    for i in range(3):
        wb.add_request([100 + i, 200, 300, 400] * 5, greedy(4))
    records = wb.run(progress=False)
    yield wb, records
    wb.close()


def test_every_view_counts_the_same_host_bound_steps(host_bound_run, tmp_path):
    wb, records = host_bound_run
    steps = wb.history.steps
    expected = sum(1 for s in steps.step if s % 2 == 0)
    assert int(steps.host_bound.sum()) == expected
    assert list(steps.host_bound) == [s % 2 == 0 for s in steps.step]
    assert [r.host_bound for r in records] == list(steps.host_bound)
    n = len(steps)
    assert f"host-bound in {expected} of {n} steps" in json.dumps(step_times(wb.history).to_dict())
    run = wb.snapshot()
    assert compare_table({"run": run}).loc["run", "host-bound steps"] == expected
    (described,) = compare_summary({"run": run})
    assert f"{expected} of {n} steps host-bound" in described
    other = {"run": run, "again": wb.snapshot(run="again")}
    (host,) = [s for s in compare_summary(other) if s.startswith("Host-bound")]
    assert f"run {expected} of {n}" in host and "forward and sampling" in host  # CPU: said so
    report = write_report(run, tmp_path / "r.html").read_text()
    assert html.escape(f"{expected} of {n} steps host-bound") in report
    from workbench.viz.dashboard import Dashboard

    board = Dashboard(run)
    for step in (0, 1):  # the status line of a host-bound step says so, of another not
        board.slider.value = step
        status = board.status.value
        here = "host-bound: <b>this step</b>" if step % 2 == 0 else "host-bound: not this step"
        assert f"{here}; {expected} of {n} steps in the run" in status, status
        assert "forward and sampling (CPU)" in status


def test_device_busy_is_the_device_time_over_the_steps_span(host_bound_run):
    """The steps' spans: from the previous step's completion (or the step's own launch, when
    later) to its completion; device busy is their device time over that."""
    wb, _ = host_bound_run
    steps = wb.history.steps
    previous, span = float("-inf"), []
    for launched, completed in zip(steps.launched_at, steps.completed_at):
        span.append((completed - max(previous, launched)) * 1e3)
        previous = completed
    assert list(steps.span_ms) == pytest.approx(span)
    busy = 100 * steps.device_ms.sum() / sum(span)
    assert compare_table({"run": wb.snapshot()}).loc["run", "device busy (%)"] == pytest.approx(
        busy, abs=0.05
    )
    assert list(steps.idle_ms) == pytest.approx(
        [max(s - d, 0) for s, d in zip(span, steps.device_ms)]
    )


def test_output_reads_as_sentences_and_one_line(host_bound_run):
    wb, records = host_bound_run
    assert isinstance(records, StepRecords)
    line = repr(records)
    assert "\n" not in line and line.startswith(f"{len(records)} steps (0-{len(records) - 1}: ")
    assert "3 requests finished" in line and "StepRecord(" not in line
    record_html = records[0]._repr_html_()
    assert record_html.count("<details>") == 1  # one line; the ledger folded under it
    summary = compare_summary({"run": wb.snapshot(), "again": wb.snapshot(run="again")})
    text = str(summary)
    assert text == "\n".join(summary) and "['" not in text and "[" not in text.split("\n")[0]
    assert summary._repr_html_().count("<li>") == len(summary)


def test_integers_stay_integers_and_no_figure_is_all_empty(host_bound_run):
    wb, _ = host_bound_run
    table = compare_table({"run": wb.snapshot(), "again": wb.snapshot(run="again")}, full=True)
    for column in ("steps", "prefill steps", "decode steps", "host-bound steps", "output tokens"):
        assert pd.api.types.is_integer_dtype(table[column]), column
    steps = len(wb.history.steps)
    assert re.search(rf"^run\s.*\s{steps}\s", table[["output tokens/s", "steps"]].to_string(), re.M)
    assert not [c for c in table.columns if table[c].isna().all()]  # e.g. no roofline on a CPU
    assert "mean step bound (ms)" not in table.columns


def test_the_runs_clock_stops_between_the_calls_of_a_workbench_stepped_by_hand():
    """A person's pause between two cells is not the run's: a request added before it arrives
    when stepping goes on, so its TTFT is the engine's (a step of a tiny model: milliseconds),
    not the 0.3 s the test sleeps."""
    wb = Workbench("tiny-qwen3")
    wb.add_request([5, 6, 7], greedy(3))
    time.sleep(0.3)
    wb.step()
    time.sleep(0.3)
    wb.add_request([5, 6, 8], greedy(3))
    time.sleep(0.3)
    wb.run(progress=False)
    requests, steps = wb.history.requests, wb.history.steps
    assert (requests.ttft_s < 0.3).all(), requests.ttft_s
    assert steps.completed_at.iloc[-1] < 0.3  # the run took milliseconds of its own clock
    assert requests.arrival_s.iloc[1] >= steps.completed_at.iloc[0]  # after the first step
    wb.close()


def test_a_panel_whose_values_span_a_hundredfold_is_drawn_on_a_log_scale():
    """One setting 150 times slower than another: on a linear axis its bars would dwarf the
    other's into a flat line; the TTFT panel goes to a log scale, and says so. At 2x it does
    not."""
    from workbench.viz import compare_chart

    requests = [([1000 + i] * 40, greedy(8), 12 * i) for i in range(3)]
    for scale, log in ((150.0, True), (2.0, False)):
        runs = {**_twin_runs(1.0, "fast", requests), **_twin_runs(scale, "slow", requests)}
        ttft = compare_chart(runs, unit="ms").to_dict()["vconcat"][0]
        y = ttft["encoding"]["y"]
        assert (y.get("scale", {}).get("type") == "log") == log, y
        assert ("log scale" in y["title"]) == log


def test_the_bootstraps_row_percentiles_are_numpys_to_the_last_digit():
    """The noise's percentiles of each resample come from one sort of all of them; they must be
    `np.nanpercentile`'s: requests without a TPOT (NaN) left out, a resample of NaN only NaN."""
    import warnings

    import numpy as np

    from workbench.viz.noise import _percentiles

    rng = np.random.default_rng(7)
    qs = (0, 37.5, 50, 90, 95, 99, 100)
    for trial in range(60):
        rows, columns = rng.integers(1, 30, size=2)
        values = rng.lognormal(size=(rows, columns)) * 1000
        values[rng.random((rows, columns)) < trial / 60] = np.nan  # none, then ever more
        values[0] = np.nan if trial % 2 else np.round(values[0])  # a row of NaN; ties
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy's, for a row of NaN
            expected = np.nanpercentile(values, qs, axis=1)
        np.testing.assert_array_equal(_percentiles(values, qs), expected)


def test_runs_whose_steps_never_repeat_a_shape_have_no_known_noise_and_no_winner():
    """One run each, every step a shape of its own: a bootstrap of the run's own steps and two
    requests of equal TTFT gives ± 0, which named winners out of machine noise alone (chunk 64,
    65 and 66 run the same steps). Such a figure's noise is not known: no verdict, and no ± 0."""
    wb = Workbench("tiny-llama", max_extend_tokens=64, max_running_reqs=4)
    for prompt in ("The capital of France is", "Hello"):
        wb.add_request(prompt, SamplingParams(max_tokens=3))
    settings = {f"chunk {c}": dict(max_extend_tokens=c) for c in (64, 65, 66)}
    runs = wb.compare(settings, progress=False)
    table = compare_table(runs)
    for figure in ("output tokens/s", "p50 TTFT (ms)", "p50 ITL (ms)", "device busy (%)"):
        assert f"{figure} ±" not in table or table[f"{figure} ±"].isna().all(), table
    said = compare_summary(runs)
    figures = [s for s in said if s.startswith(("Throughput", "Time", "Inter-token"))]
    assert len(figures) == 4 and all(" is not judged (" in s for s in figures), said
    assert all("noise not known)" in s and "highest" not in s for s in figures), said
    wb.check_integrity()
    wb.close()
