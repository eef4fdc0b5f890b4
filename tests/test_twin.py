"""The twin: the real scheduler, cache and page table on predicted step times.

Schedule exactness against the real engine (every policy, chunk and page sizes, radix and naive
caches, arrivals, aborts, overlap), a known cost function fitted back and reproduced, costs
saved and loaded, other models refused, the virtual clock (arrivals by time, overlap against
host-bound steps), and the twin's own error against real runs."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import numpy as np
import pytest

from workbench import (
    LLM,
    SamplingParams,
    Workbench,
    fit_step_costs,
    load_run,
    load_step_costs,
)
from workbench.clocks import HOST_STAGES
from workbench.runs import RunHistory
from workbench.twin.accuracy import validate_twin, validation_summary
from workbench.twin.costs import MIN_SHAPE_STEPS, Linear, StepCosts
from workbench.twin.features import DEVICE_FEATURES, HOST_FEATURES, step_features
from workbench.twin.replay import replay_requests

from .conftest import shared

MODEL = "tiny-llama"
NUM_PAGES = 1200  # KV tokens: small enough that the pool refuses some admissions


def workload(seed: int = 0, n: int = 10):
    """Prompts of 20-200 tokens, a few sharing a prefix of 64 with an earlier one; 3-20 output
    tokens each (EOS ignored); arriving at steps 0.."""
    rng = random.Random(seed)
    common = [rng.randrange(1000, 9000) for _ in range(64)]
    out = []
    for i in range(n):
        ids = [rng.randrange(1000, 9000) for _ in range(rng.randint(20, 200))]
        if i % 3 == 2:
            ids = common + ids
        sampling = SamplingParams(max_tokens=rng.randint(3, 20), ignore_eos=True)
        out.append((ids, sampling, rng.randint(0, 3)))
    return out


def synthetic_costs(
    model: str = MODEL, device: str = "cpu", host_ms: float = 0.05, prompt_graph=False, **meta
):
    """Step costs of known coefficients (no run needed); `prompt_graph`: with costs of prompt
    steps replayed as graphs (fitted on runs of an engine that had them)."""
    eager = DEVICE_FEATURES["eager"]
    graph = DEVICE_FEATURES["graph"]
    paths = ("eager", "graph", "prompt_graph") if prompt_graph else ("eager", "graph")
    prompt = Linear(DEVICE_FEATURES["prompt_graph"], (0.7, 0.3, 1.0, 0.5, 0.2, 0.01))
    return StepCosts(
        meta={
            "model": model,
            "device": device,
            "device_name": "cpu" if device == "cpu" else "NVIDIA H200",
            "dtype": "float32" if device == "cpu" else "bfloat16",
            "tp_size": 1,
            "num_pages": NUM_PAGES,
            "page_size": 1,
            "runs": ["synthetic"],
            "steps": 0,
            **meta,
        },
        device={
            "eager": Linear(eager, (3.0, 1.0, 4.0, 2.0, 0.5, 0.3, 0.01)),
            "graph": Linear(graph, (0.8, 0.004, 0.02)),
            **({"prompt_graph": prompt} if prompt_graph else {}),
        },
        host={
            path: {
                s: Linear(HOST_FEATURES[s], (host_ms, 0.002, 0.01)[: len(HOST_FEATURES[s])])
                for s in HOST_STAGES
            }
            for path in paths
        },
        between_ms=0.02,
    )


def run_workload(wb, requests, abort_at: tuple[int, int] | None = None):
    for ids, sampling, step in requests:
        wb.add_request(ids, sampling, arrival_step=step)
    if abort_at is not None:
        step, uid = abort_at
        while wb.step_index < step and wb.step() is not None:
            pass
        wb.abort(uid)
    wb.run(progress=False)
    wb.check_integrity()
    return wb.history


SCHEDULE = (
    ["step", "phase", "batch_size", "padded_size", "num_tokens", "prefill_tokens"]
    + ["chunk_tokens", "decode_tokens", "sampled", "decode_context", "prefill_pairs"]
    + ["admitted", "waiting_reasons", "queue_len", "running"]
    + ["kv_free", "kv_evictable", "kv_in_use", "free_slots"]
)
# (not `table_idx`: which free row a request gets depends on what the engine ran before)
LEDGER = (
    ["step", "uid", "kind"]
    + ["cached_len", "device_len", "extend_len", "cached_tokens"]
    + ["finish"]
)


def assert_same_schedule(real, twin):
    for table, columns in (("steps", SCHEDULE), ("ledger", LEDGER)):
        a = getattr(real, table)[columns].reset_index(drop=True)
        b = getattr(twin, table)[columns].reset_index(drop=True)
        assert len(a) == len(b), f"{table}: {len(a)} rows real, {len(b)} twin"
        diff = (a != b) & ~(a.isna() & b.isna())
        assert not diff.any().any(), f"{table} differs:\n{a[diff.any(axis=1)].head()}"
    adm = ["step", "uid", "admitted", "reason"]
    assert real.admissions[adm].equals(twin.admissions[adm])
    r, t = real.requests, twin.requests
    assert r.completion_tokens.equals(t.completion_tokens)
    assert r.finish_reason.equals(t.finish_reason)


@pytest.mark.parametrize(
    "policy, chunk, page, cache, overlap",
    [
        ("prefill_first", 16, 1, "radix", False),
        ("decode_first", 64, 4, "naive", True),
        ("mixed", 32, 2, "radix", False),
        ("prefill_first", 256, 4, "radix", True),
        ("decode_first", 24, 1, "radix", False),
        ("mixed", 64, 1, "naive", True),
    ],
)
def test_the_twin_schedules_step_for_step_as_the_real_engine(policy, chunk, page, cache, overlap):
    settings = dict(max_extend_tokens=chunk, policy=policy, cache=cache, overlap=overlap)
    real = shared(
        lambda: Workbench(MODEL, page_size=page, num_pages=NUM_PAGES // page), "twin", page
    )
    real.reset()
    real.reconfigure(**settings)
    requests = workload(seed=chunk + page)
    abort = (5, 3)  # request 3 aborted at step 5 (waiting, chunked or decoding by then)
    real_history = run_workload(real, requests, abort)
    twin = Workbench(
        MODEL,
        step_costs=synthetic_costs(),
        page_size=page,
        num_pages=NUM_PAGES // page,
        **settings,
    )
    twin_history = run_workload(twin, requests, abort)
    assert_same_schedule(real_history, twin_history)
    steps = twin_history.steps
    assert steps.simulated.all() and not real_history.steps.simulated.any()
    assert twin_history.meta["simulated"] and twin.run_meta()["simulated"]
    reasons = set(",".join(real_history.steps.waiting_reasons).split(","))
    assert reasons - {""}, "the workload should make some requests wait"


def timed_runs(wb: Workbench, truth: StepCosts) -> dict[str, RunHistory]:
    """Two real runs (prefill first, whole prompts batched up to 1,024 tokens; mixed, chunks of
    256), their steps timed by the known step costs `truth` (device and eager host stages)."""
    runs = {}
    for policy, chunk, seed in (("prefill_first", 1024, 3), ("mixed", 256, 4)):
        wb.reset()
        wb.reconfigure(max_extend_tokens=chunk, policy=policy)
        at_once = [(ids, sampling, 0) for ids, sampling, _ in workload(seed=seed, n=14)]
        run_workload(wb, at_once)
        run = wb.snapshot(run=f"{policy} {chunk}")
        steps = run.steps.copy()
        steps["device_ms"] = truth.predict_steps(steps)[0]
        f = step_features(steps)
        for stage in HOST_STAGES:
            steps[f"host_{stage}_ms"] = truth.host["eager"][stage]({c: f[c] for c in f})
        steps["host_ms"] = steps[[f"host_{s}_ms" for s in HOST_STAGES]].sum(axis=1)
        runs[policy] = RunHistory({**run.tables(), "steps": steps}, run.meta)
    return runs


def test_a_fitted_cost_model_recovers_a_known_cost_function_and_the_twin_reproduces_it():
    """Two real runs timed by a known function: the fit finds its coefficients."""
    truth = synthetic_costs()
    runs = timed_runs(shared(lambda: Workbench(MODEL, num_pages=20000), "twin", "large"), truth)
    fitted = fit_step_costs(runs)
    assert np.allclose(fitted.device["eager"].coef, truth.device["eager"].coef, rtol=1e-6)
    for stage in HOST_STAGES:
        assert np.allclose(fitted.host["eager"][stage].coef, truth.host["eager"][stage].coef)
    assert all(e["device_error_pct"] < 1e-6 for e in fitted.errors)
    # a twin on the fitted costs times its own steps by the function
    twin = Workbench(MODEL, step_costs=fitted, max_extend_tokens=512, policy="mixed")
    history = run_workload(twin, workload(seed=5, n=14))
    expected, expected_host = truth.predict_steps(history.steps)
    assert np.allclose(history.steps.device_ms, expected, rtol=0, atol=1e-6)  # (rounded to ns)
    assert np.allclose(history.steps.host_ms, expected_host, rtol=0, atol=1e-5)
    assert "prefill" in str(fitted) and "decode" in fitted.summary()
    assert f"steps of 2 runs: {'; '.join(runs)}" in " ".join(fitted.summary().split())


def test_a_captured_shape_keeps_its_own_factor_on_the_fit(tmp_path):
    """Decode steps timed as CUDA-graph replays by a known function, one batch size's graph 10%
    slower than the function says (its own kernels): the fit keeps that size's factor, and its
    predictions come back to the recorded times; a size replayed too rarely has none."""
    truth = synthetic_costs()
    wb = shared(lambda: Workbench(MODEL, num_pages=20000), "twin", "large")
    wb.reset()
    wb.reconfigure(max_extend_tokens=256, policy="mixed")
    rng = random.Random(6)  # 12 prompts at once, 30 to 60 tokens out: decode batches of 12 to 1
    requests = [
        (
            [rng.randrange(1000, 9000) for _ in range(rng.randint(20, 60))],
            SamplingParams(max_tokens=rng.randint(30, 60), ignore_eos=True),
            0,
        )
        for _ in range(12)
    ]
    run = run_workload(wb, requests)
    steps = run.steps.copy()
    decode = (steps.phase == "decode").to_numpy()
    steps.loc[decode, "cuda_graph"] = True
    sizes = steps.padded_size[decode].value_counts()
    slow, rare = int(sizes.index[0]), sizes[sizes < MIN_SHAPE_STEPS].index
    assert sizes.iloc[0] >= MIN_SHAPE_STEPS and len(rare), "the workload should have both"
    f = step_features(steps)
    device = truth.predict_steps(steps)[0]
    device[decode] = truth.device["graph"]({c: f[c].to_numpy()[decode] for c in f})
    device[decode & (steps.padded_size == slow).to_numpy()] *= 1.1
    steps["device_ms"] = device
    for stage in HOST_STAGES:  # (the host's enqueueing below the device's time)
        steps[f"host_{stage}_ms"] = truth.host["eager"][stage]({c: f[c] for c in f})
    fitted = fit_step_costs(RunHistory({**run.tables(), "steps": steps}, run.meta))
    factors = fitted.shapes["graph"]
    assert set(factors) == {str(n) for n in sizes.index if sizes[n] >= MIN_SHAPE_STEPS}
    assert all(factors[str(slow)] > 1.05 * v for k, v in factors.items() if k != str(slow))
    predicted = fitted.predict_steps(steps)[0][decode]
    error = np.abs(predicted / device[decode] - 1)
    chosen = (steps.padded_size[decode] == slow).to_numpy()
    assert np.median(error[chosen]) < 0.01, "the slow shape's steps, with its factor"
    without = replace(fitted, shapes={})  # the fit alone takes in part of the slow shape
    alone = np.abs(without.predict_steps(steps)[0][decode][chosen] / device[decode][chosen] - 1)
    assert np.median(alone) > 5 * np.median(error[chosen])
    # a size replayed too rarely takes the factor of the nearest size that has one
    with_factor, fit_alone = fitted.predict_steps(steps)[0], without.predict_steps(steps)[0]
    for size in rare:
        nearest = min(factors, key=lambda k: abs(np.log2(int(k)) - np.log2(size)))
        at = decode & (steps.padded_size == size).to_numpy()
        assert np.allclose(with_factor[at] / fit_alone[at], factors[nearest]), size
    assert "per captured shape (real / fit): " in fitted.summary()
    assert load_step_costs(fitted.save(tmp_path / "c.json")).shapes == fitted.shapes
    # the costs name the decode steps of a shape replayed too rarely for its own factor, and
    # only them (the few prompt steps were too few to fit a path of their own)
    named = fitted.uncalibrated(steps)
    assert "eager" not in fitted.device and (named[~decode] == "eager: no calibration step").all()
    rare_steps = decode & steps.padded_size.isin(rare).to_numpy()
    assert (named[decode] != "").tolist() == rare_steps[decode].tolist()
    for reason, size in zip(named[rare_steps], steps.padded_size[rare_steps]):
        assert reason == f"shape {size}: {sizes[size]} calibration steps"


def test_the_costs_name_what_their_calibration_did_not_cover(tmp_path):
    """Costs fitted on short prompts in chunks of 32 with at most 4 requests running say, of a
    run with long prompts in chunks of 256 and 12 running, which of its steps lie beyond what
    they were fitted on and why; of their own steps, none; of a path never fitted, that it
    was not; `validate_twin` gives each setting's share of such steps."""
    # (an engine of its own: the others of this file keep every request slot)
    wb = shared(lambda: Workbench(MODEL, num_pages=20000, max_running_reqs=12), "twin", 12)
    wb.reset()
    wb.reconfigure(max_extend_tokens=32, policy="mixed", max_running_reqs=4)
    calibration = run_workload(wb, workload(seed=2, n=8))
    costs = fit_step_costs(calibration)
    assert not (costs.uncalibrated(calibration.steps) != "").any()
    with pytest.raises(TypeError, match="steps: a steps table .*got list"):
        costs.uncalibrated([1, 2, 3])
    assert "calibrated, eager: " in costs.summary()
    wb.reset()
    wb.reconfigure(max_extend_tokens=256, policy="mixed", max_running_reqs=12)
    rng = random.Random(9)
    long = [
        (
            [rng.randrange(1000, 9000) for _ in range(rng.randint(150, 250))],
            SamplingParams(max_tokens=12, ignore_eos=True),
            0,
        )
        for _ in range(12)
    ]
    wider = run_workload(wb, long)
    named = costs.uncalibrated(wider.steps)
    steps = wider.steps
    spans = costs.ranges["eager"]
    tokens = (steps.num_tokens + steps.padding_tokens) / 1e3
    beyond = tokens > spans["tokens"][1] + 0.1 * (spans["tokens"][1] - spans["tokens"][0])
    assert beyond.any()
    for reason, over, value in zip(named, beyond, tokens):
        said = [r for r in reason.split("; ") if r.startswith("tokens ")]
        assert said == (
            [f"tokens {value:.4g} > {spans['tokens'][1]:.4g} (1k tokens)"] if over else []
        )
    assert any("sampled 12 > " in r for r in named)  # 12 running, where 4 were
    # a path the calibration never took
    as_graphs = steps.assign(cuda_graph=steps.phase == "decode")
    named = costs.uncalibrated(as_graphs)
    decode = (steps.phase == "decode").to_numpy()
    assert all(r == "graph: no calibration step" for r in named[decode])
    # a loaded copy says the same; validate_twin gives the share per setting
    loaded = load_step_costs(costs.save(tmp_path / "costs.json"))
    assert (loaded.uncalibrated(steps) == costs.uncalibrated(steps)).all()
    twin = Workbench(MODEL, step_costs=costs, max_extend_tokens=256, max_running_reqs=12)
    twins = twin.compare({"wider": {}}, long, progress=False)
    table = validate_twin({"wider": wider}, twins)
    share = (costs.uncalibrated(twins["wider"].steps) != "").mean() * 100
    assert share > 0
    assert np.allclose(table.uncalibrated_pct, share)


def test_saved_costs_round_trip_and_other_models_are_refused(tmp_path):
    costs = synthetic_costs()
    path = costs.save(tmp_path / "costs.json")
    loaded = load_step_costs(path)
    assert loaded.to_dict() == costs.to_dict()
    histories = []
    for c in (costs, loaded):
        twin = Workbench(MODEL, step_costs=c, max_extend_tokens=32)
        histories.append(run_workload(twin, workload(seed=5)).steps)
    assert histories[0].equals(histories[1])
    with pytest.raises(ValueError, match="fitted on runs of 'tiny-llama', not 'smollm2'"):
        Workbench("smollm2", step_costs=costs)
    with pytest.raises(ValueError, match="device='cuda'"):
        Workbench(MODEL, step_costs=costs, device="cuda")
    with pytest.raises(TypeError, match="step_costs must be StepCosts"):
        Workbench(MODEL, step_costs={"eager": 1})
    real = shared(lambda: Workbench(MODEL, page_size=1, num_pages=NUM_PAGES), "twin", 1)
    real.reset()
    run_workload(real, workload(seed=6, n=4))
    mine = real.snapshot(run="calib")
    other = type(mine)(mine.tables(), {**mine.meta, "model": "smollm2"})
    with pytest.raises(ValueError, match="one model on one device.*smollm2"):
        fit_step_costs({"mine": mine, "other": other})
    # in a list, runs are named by their meta's "run": one name must not hide the other model
    with pytest.raises(ValueError, match="one model on one device.*smollm2"):
        fit_step_costs([mine, other])
    with pytest.raises(TypeError, match=r"runs: '.*run.parquet' is a path.*load_run"):
        fit_step_costs(str(tmp_path / "run.parquet"))
    # what is no run, or a run of no step records, is refused naming it
    import pandas as pd

    for runs in (None, 3, pd.DataFrame(), mine.steps):
        with pytest.raises(TypeError, match="runs must be a run history"):
            fit_step_costs(runs)
    unrecorded = LLM(MODEL)  # record="off"
    unrecorded.generate(["hi"], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="run 'run 0' has no step records .*record='off'"):
        fit_step_costs(unrecorded)
    with pytest.raises(TypeError, match="costs must be StepCosts"):
        validate_twin({"calib": mine}, {"calib": mine}, costs=3)


def test_requests_arrive_on_the_virtual_clock_and_an_idle_twin_jumps_to_them():
    twin = Workbench(MODEL, step_costs=synthetic_costs(), max_extend_tokens=64)
    for i, (ids, sampling, _) in enumerate(workload(seed=7, n=6)):
        twin.add_request(ids, sampling, arrival_time=100.0 * i)  # minutes apart
    started = time.perf_counter()
    twin.run(progress=False)
    # a guard against a hang, not a speed test: sleeping through them would take 500 s
    assert time.perf_counter() - started < 120
    r = twin.history.requests
    assert np.allclose(r.arrival_s, [100.0 * i for i in range(6)])
    assert (r.first_scheduled_s >= r.arrival_s).all()
    assert (r.first_scheduled_s - r.arrival_s < 0.01).all()  # each finds an idle engine
    assert (twin.history.steps.launched_at.diff().dropna() >= 0).all()


@pytest.mark.parametrize("host_ms", [0.05, 5.0])
def test_with_overlap_a_step_takes_the_longer_of_its_host_and_its_device(host_ms):
    """Decode steps of a GPU's twin, overlap on: each step's period is the device's time when
    the host keeps ahead of it, and the host's own time per step when it does not."""
    costs = synthetic_costs(device="cuda", host_ms=host_ms, cuda_graph=True)
    twin = Workbench("tiny-llama", step_costs=costs, overlap=True, cuda_graph=True)
    ids = [[7] * 10 for _ in range(8)]
    twin.llm.generate(ids, SamplingParams(max_tokens=40, ignore_eos=True))
    steps = twin.history.steps
    decode = steps[(steps.phase == "decode") & steps.cuda_graph].iloc[5:-5]
    period_ms = decode.completed_at.diff().dropna() * 1e3
    host = decode.host_ms.iloc[1:] + costs.between_ms
    expected = np.maximum(decode.device_ms.iloc[1:], host)
    assert np.allclose(period_ms, expected, rtol=1e-6)
    assert (decode.padded_size == 8).all()
    if host_ms > 1:
        assert (decode.wait_ms < 1e-9).all()  # host-bound: the tokens are always ready
    else:
        assert (decode.wait_ms > 0).all()


@pytest.mark.parametrize("prompt_graph", [True, False])
def test_a_gpu_twin_replays_prompt_steps_as_graphs_when_its_runs_did(prompt_graph):
    """Costs fitted on runs of an engine that captured prefill and mixed steps: the twin pads
    those steps to the same prompt shapes as `GraphRunner` and times them on that path's
    costs; costs of runs whose prompt steps ran eagerly: the twin runs them eagerly too."""
    from workbench.engine.graph import graph_shapes

    costs = synthetic_costs(device="cuda", prompt_graph=prompt_graph, cuda_graph=True)
    twin = Workbench(
        MODEL,
        step_costs=costs,
        cuda_graph=True,
        cuda_graph_max_tokens=128,
        max_extend_tokens=256,
        policy="mixed",
        max_running_reqs=16,
    )
    history = run_workload(twin, workload(seed=8, n=12))
    steps = history.steps
    prompt = steps[steps.phase != "decode"]
    fits = prompt.num_tokens <= 128
    assert fits.any() and (~fits).any()
    assert (prompt.cuda_graph == (fits & prompt_graph)).all()
    graphs = prompt[prompt.cuda_graph]
    shapes = set(graph_shapes(128, 16, twin.engine.table.max_seq_len))
    padded = set(zip(graphs.num_tokens + graphs.padding_tokens, graphs.padded_size))
    assert padded <= shapes and bool(padded) == prompt_graph
    assert (prompt[~prompt.cuda_graph].padding_tokens == 0).all()
    device, _ = costs.predict_steps(steps)
    assert np.allclose(steps.device_ms, device, rtol=0, atol=1e-6)
    if prompt_graph:  # the prompt path's own costs, on the padded tokens
        f = step_features(graphs)
        assert (f.path == "prompt_graph").all()
        want = costs.device["prompt_graph"]({c: f[c] for c in f})  # (above the host's 0.1 ms)
        assert np.allclose(graphs.device_ms, want, rtol=0, atol=1e-6)


def test_a_twin_captures_what_the_recorded_engine_captured_unless_told_otherwise():
    costs = synthetic_costs(
        device="cuda",
        prompt_graph=True,
        cuda_graph=True,
        cuda_graph_max_tokens=64,
        cuda_graph_max_bs=32,
    )
    recorded = Workbench(MODEL, step_costs=costs).engine.config
    assert (recorded.cuda_graph_max_tokens, recorded.cuda_graph_max_bs) == (64, 32)
    given = Workbench(MODEL, step_costs=costs, cuda_graph_max_tokens=128).engine.config
    assert (given.cuda_graph_max_tokens, given.cuda_graph_max_bs) == (128, 32)
    # and overlaps as a GPU engine does (a Workbench of a real engine does not unless told)
    assert Workbench(MODEL, step_costs=costs).scheduler.overlap
    assert not Workbench(MODEL, step_costs=costs, overlap=False).scheduler.overlap
    assert not Workbench(MODEL, step_costs=synthetic_costs()).scheduler.overlap  # CPU runs


def test_the_twins_error_is_shown_beside_the_real_runs_noise():
    real = shared(lambda: Workbench(MODEL, page_size=1, num_pages=NUM_PAGES), "twin", 1)
    runs = {}
    for repeat in (1, 2):
        real.reset()
        real.reconfigure(max_extend_tokens=64, policy="prefill_first", cache="radix")
        run_workload(real, workload(seed=8, n=8))
        runs[f"chunk 64 #{repeat}"] = real.snapshot(run=f"chunk 64 #{repeat}")
    costs = fit_step_costs(runs)
    twin = Workbench(MODEL, step_costs=costs, max_extend_tokens=64)
    twins = twin.compare({"chunk 64": {}}, replay_requests(runs["chunk 64 #1"]), arrival="time")
    table = validate_twin(runs, twins)
    assert set(table.setting) == {"chunk 64"}
    per_step = {"step device time", "prompt step device time"}
    assert {"p95 TTFT (ms)", "median ITL (ms)", "E2E (ms)"} | per_step <= set(table.figure)
    assert table[table.figure.isin(per_step)].error_pct.notna().all()  # prompts were chunked
    timed = table[~table.figure.isin(per_step)]
    assert timed.real.notna().all() and timed.predicted.notna().all()
    assert timed.noise_pct.notna().all()  # two real runs of the setting
    summary = validation_summary(table)
    assert "median_error_pct" in summary and len(summary) == len(set(table.figure))
    with pytest.raises(ValueError, match="no real run of setting 'other'"):
        validate_twin(runs, {"other": twins["chunk 64"]})


def test_views_and_saved_runs_say_a_twins_run_was_simulated(tmp_path):
    twin = Workbench(MODEL, step_costs=synthetic_costs(), max_extend_tokens=32)
    run_workload(twin, workload(seed=9, n=4))
    report = twin.report(tmp_path / "twin.html").read_text()
    assert "workbench twin (simulated)" in report and "step costs fitted on" in report
    loaded = load_run(twin.save(tmp_path / "twin.parquet"))
    assert loaded.meta["simulated"] and loaded.steps.simulated.all()
    shown = repr(loaded)  # one line: what tells runs apart, not the whole meta
    assert "\n" not in shown and "simulated" in shown and "step_costs" not in shown
    assert StepCosts.from_dict(loaded.meta["step_costs"]).to_dict() == twin.llm.step_costs.to_dict()
    board = twin.dashboard()
    board.slider.value = 1
    assert "simulated" in board.status.value


def test_comparisons_overlay_a_twins_runs_on_real_ones():
    from workbench.viz import compare_chart, compare_table, sweep_chart

    real = shared(lambda: Workbench(MODEL, page_size=1, num_pages=NUM_PAGES), "twin", 1)
    real.reset()
    real.reconfigure(max_extend_tokens=32, policy="prefill_first", cache="radix", overlap=False)
    requests = [(ids, s, 0.01 * i) for i, (ids, s, _) in enumerate(workload(seed=10, n=5))]
    runs = real.compare({"chunk 32": {}}, requests, progress=False, arrival="time")
    twin = Workbench(MODEL, step_costs=synthetic_costs(), max_extend_tokens=32)
    settings = {f"chunk {c} (twin)": dict(max_extend_tokens=c) for c in (16, 32, 64)}
    runs |= twin.compare(settings, requests, progress=False, arrival="time")
    table = compare_table(runs)
    assert list(table.index) == list(runs) and table.loc["chunk 32 (twin)", "steps"] > 0
    spec = compare_chart(runs).to_dict()
    assert "simulated" in str(spec) and "real" in str(spec)
    sweep = sweep_chart(runs, figures=("p95 TTFT (ms)",)).to_dict()
    values = next(iter(sweep["datasets"].values()))
    assert {v["source"] for v in values} == {"real", "simulated"}
    assert sorted(v["max_extend_tokens"] for v in values) == [16, 32, 32, 64]


@pytest.mark.parametrize(
    "asked",
    [
        {"logprobs": 2},
        {"prompt_logprobs": 1},
        {"logit_bias": {7: 5.0}},
        {"presence_penalty": 0.5},
        {"frequency_penalty": -0.5},
        {"repetition_penalty": 1.2},
    ],
    ids=lambda a: next(iter(a)),
)
def test_a_twin_refuses_what_its_costs_do_not_time_and_keeps_running(asked):
    """A twin computes no logits, and its costs come from runs without penalties, a bias or log
    probabilities: such a request is refused by name before anything is queued, and the
    twin runs the others as before."""
    twin = Workbench(MODEL, step_costs=synthetic_costs(), max_extend_tokens=64)
    (name,) = asked
    with pytest.raises(ValueError, match=rf"^{name}=.*leave {name} at"):
        twin.add_request([5, 6, 7, 8], SamplingParams(max_tokens=3, **asked))
    assert twin.submitted_count == 0 and not twin.scheduler.live_reqs
    twin.add_request([5, 6, 7, 8], SamplingParams(max_tokens=3, temperature=0.7, seed=1))
    twin.run(progress=False)
    twin.check_integrity()
    (out,) = twin.outputs()
    assert out["completion_tokens"] == 3 and out["logprobs"] is None


def test_runs_say_their_kernels_and_a_twin_predicts_only_its_runs_kernels(tmp_path):
    """A saved run carries the kernels its engine resolved (`Engine.kernels`); step costs keep
    the kernels their runs shared and refuse runs that ran different ones; a twin says it ran
    its runs' kernels and refuses a kernel option by name (it runs none), but not one left at
    its default."""
    real = shared(lambda: Workbench(MODEL, page_size=1, num_pages=NUM_PAGES), "twin", 1)
    real.reset()
    run_workload(real, workload(seed=8, n=4))
    kernels = real.llm.engine.kernels
    assert kernels["attention"] == "torch" and kernels["decode_cores"] is None
    mine = load_run(real.save(tmp_path / "run.parquet"))
    assert mine.meta["kernels"] == kernels
    costs = fit_step_costs(mine)
    assert costs.meta["kernels"] == kernels
    assert " steps of 1 run: " in " ".join(costs.summary().split())
    assert "kernels of its runs: attention torch, decode_attention torch," in costs.summary()
    assert "kernels of its runs: not recorded" in synthetic_costs().summary()
    # a run of other kernels (its meta as a GPU run's would say them)
    gpu = {**kernels, "attention": "flashinfer", "decode_cores": "tensor cores"}
    other = type(mine)(mine.tables(), {**mine.meta, "run": "other", "kernels": gpu})
    with pytest.raises(ValueError, match=r"same kernels: run 'other' ran .*'tensor cores'"):
        fit_step_costs({"mine": mine, "other": other})
    twin = Workbench(MODEL, step_costs=costs, max_extend_tokens=32, moe_backend="auto")
    run_workload(twin, workload(seed=5, n=3))
    assert twin.run_meta()["kernels"] == kernels
    with pytest.raises(ValueError, match=r"^decode_tensor_cores=True: a twin runs no kernels"):
        Workbench(MODEL, step_costs=costs, decode_tensor_cores=True)
    with pytest.raises(ValueError, match=r"small_gemm=True.*they do not say which"):
        Workbench(MODEL, step_costs=synthetic_costs(), small_gemm=True)
    # asking for the kernels the runs ran is taken; the other value is refused, saying theirs
    on_gpu = fit_step_costs(type(mine)(mine.tables(), {**mine.meta, "kernels": gpu}))
    Workbench(
        MODEL, step_costs=on_gpu, decode_tensor_cores=True, fused_kernels=kernels["fused_kernels"]
    )
    with pytest.raises(
        ValueError, match=r"decode_tensor_cores=False.*they ran decode_tensor_cores=True"
    ):
        Workbench(MODEL, step_costs=on_gpu, decode_tensor_cores=False)
    flipped = not kernels["fused_kernels"]
    with pytest.raises(ValueError, match=rf"they ran fused_kernels={kernels['fused_kernels']}"):
        Workbench(MODEL, step_costs=costs, fused_kernels=flipped)
