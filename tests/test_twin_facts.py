"""The twin's figures against values worked out by hand: `validate_twin`'s error, noise and real
value, the fitted host time between two steps, the order of settings, and the sweep chart's data
and axes.

The runs are built step by step (`StepRecord`s in a `History`): one request of a 100-token
prompt, a prefill step that gives its first token, then decode steps, each completing when the
test says. So every figure of a run is known without running an engine: its TTFT is the first
step's completion, its ITL the time between two completions."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench import fit_step_costs
from workbench.clocks import HOST_STAGES
from workbench.history.history import History
from workbench.history.latency import FIGURES, run_figures
from workbench.scheduler.record import KVState, StepRecord
from workbench.twin.accuracy import validate_twin
from workbench.twin.costs import Linear, StepCosts
from workbench.twin.features import DEVICE_FEATURES, HOST_FEATURES

PROMPT = 100  # tokens
SETUP = {
    "model": "tiny-llama",
    "device": "cpu",
    "device_name": "cpu",
    "dtype": "float32",
    "tp_size": 1,
}
RECORD_MS = 0.05  # each step's host record stage
STAGE_MS = dict.fromkeys(HOST_STAGES, 0.01) | {"record": RECORD_MS}


def recorded_run(times: list[tuple[float, float]], **meta) -> History:
    """One request arriving at 0 s: step 0 computes its prompt and gives its first token, each
    later step decodes one more; `times`: each step's (launched, completed) seconds."""
    history = History()
    history.meta = {**SETUP, **meta}
    history.arrive(0, 0, 0.0, PROMPT, len(times))
    last = len(times) - 1
    for i, (launched, completed) in enumerate(times):
        cached, new = (0, PROMPT) if i == 0 else (PROMPT + i - 1, 1)
        # ReqView's fields, one value each: uid, kind, table_idx, cached_len, device_len,
        # max_device_len, extend_len, cached_tokens
        view = (0, "prefill" if i == 0 else "decode", 0, cached, cached + new, 1024, new, 0)
        history.append(
            StepRecord(
                step=i,
                phase="prefill" if i == 0 else "decode",
                _launched=tuple((v,) for v in view),
                _tokens=(1000 + i,),
                _finishes=((0, "length"),) if i == last else (),
                _admissions=((0, True, None, PROMPT, 0),) if i == 0 else (),
                _behind=(),
                _behind_reason="",
                queue_len=0,
                running=0 if i == last else 1,
                kv=KVState(free=900, evictable=0, in_use=100, total=1000),
                free_slots=3,
                padded_size=1,
                cuda_graph=False,
                overlapped=False,
                launched_at=launched,
                completed_at=completed,
                device_ms=5.0 if i == 0 else 2.0 + 0.1 * i,
                host_ms=sum(STAGE_MS.values()),
                host_stage_ms=tuple(STAGE_MS.values()),
            )
        )
    return history


def timed_run(ttft_ms: float, itl_ms: float, tokens: int = 3, **meta) -> History:
    """A run whose request gets its first token `ttft_ms` after arriving and each later one
    `itl_ms` after the one before (the next step launched as the last completes)."""
    done = [(ttft_ms + k * itl_ms) / 1e3 for k in range(tokens)]
    return recorded_run(list(zip([0.0, *done[:-1]], done)), **meta)


def flat_costs() -> StepCosts:
    """Step costs of the eager path alone, 1 ms per unit of every feature (what they predict
    does not matter here: only that the runs' steps lie on a path they fitted)."""
    eager = DEVICE_FEATURES["eager"]
    return StepCosts(
        meta={**SETUP, "runs": ["by hand"], "steps": 0},
        device={"eager": Linear(eager, (1.0,) * len(eager))},
        host={
            "eager": {
                s: Linear(HOST_FEATURES[s], (0.01,) * len(HOST_FEATURES[s])) for s in HOST_STAGES
            }
        },
        between_ms=0.0,
    )


def test_the_runs_built_by_hand_have_the_figures_they_were_built_with():
    figures = run_figures(timed_run(100, 10))
    assert figures["p50 TTFT (ms)"] == pytest.approx(100)
    assert figures["median ITL (ms)"] == pytest.approx(10)
    assert figures["TPOT (ms)"] == pytest.approx(10)
    assert figures["E2E (ms)"] == pytest.approx(120)
    assert figures["throughput (tok/s)"] == pytest.approx(3 / 0.120)


def test_the_twins_error_is_signed_against_the_mean_of_the_real_runs_and_noise_in_percent():
    """Three real runs of one setting: TTFT 100, 110 and 150 ms (mean 120, first 100, median
    110), ITL 10, 12 and 14 ms (mean 12). The twin: TTFT 150 ms, ITL 9 ms. So the twin's TTFT
    is (150 - 120) / 120 = +25% (it predicts more), its ITL (9 - 12) / 12 = -25%; the real runs'
    noise (their spread over their mean) is 50 / 120 = 41.67% and 4 / 12 = 33.33%."""
    real = {
        "chunk 64 #1": timed_run(100, 10),
        "chunk 64 #2": timed_run(110, 12),
        "chunk 64 #3": timed_run(150, 14),
    }
    table = validate_twin(real, {"chunk 64": timed_run(150, 9)}, costs=flat_costs())
    rows = table.set_index("figure")
    ttft, itl = rows.loc["p50 TTFT (ms)"], rows.loc["median ITL (ms)"]
    assert (ttft.real, ttft.predicted) == (pytest.approx(120), pytest.approx(150))
    assert ttft.error_pct == pytest.approx(25)
    assert ttft.noise_pct == pytest.approx(50 / 120 * 100)
    assert (itl.real, itl.predicted) == (pytest.approx(12), pytest.approx(9))
    assert itl.error_pct == pytest.approx(-25)
    assert itl.noise_pct == pytest.approx(4 / 12 * 100)
    # E2E: 120, 134 and 178 ms (mean 144) against the twin's 168: +16.67%
    assert rows.loc["E2E (ms)"].error_pct == pytest.approx((168 - 144) / 144 * 100)
    assert set(FIGURES) <= set(table.figure)
    assert (table.uncalibrated_pct == 0).all()  # every step on the eager path the costs fitted


def test_settings_are_listed_with_their_numbers_in_numeric_order():
    """Chunks 2048, 512 and 64 (given in that order): listed 64, 512, 2048 in the table, in a
    pivot of it and in a groupby over it, not as text ("2048" < "512" < "64")."""
    names = ["chunk 2048 mixed", "chunk 512 mixed", "chunk 64 mixed"]
    real = {f"{name} #1": timed_run(100, 10) for name in names}
    twins = {name: timed_run(110, 11) for name in names}
    table = validate_twin(real, twins, costs=flat_costs())
    in_order = ["chunk 64 mixed", "chunk 512 mixed", "chunk 2048 mixed"]
    assert list(dict.fromkeys(table.setting)) == in_order
    pivot = table.pivot(index="setting", columns="figure", values="error_pct")
    assert list(pivot.index) == in_order
    assert list(table.groupby("setting").uncalibrated_pct.first().index) == in_order


def test_the_fitted_host_time_between_two_steps_is_the_gap_the_runs_had():
    """Twelve steps, each launched 0.3, 0.4 or 0.5 ms (in turn) after the one before completed
    and was recorded (its record stage: 0.05 ms): four gaps of 0.3 ms, four of 0.4 and three of
    0.5. The costs' time between two steps is their median, 0.4 ms (their mean: 0.391)."""
    times, at = [], 0.0
    for i in range(12):
        completed = at + (5.0 if i == 0 else 2.0) / 1e3
        times.append((at, completed))
        at = completed + (RECORD_MS + 0.3 + 0.1 * (i % 3)) / 1e3
    costs = fit_step_costs(recorded_run(times, run="gaps"))
    assert costs.between_ms == pytest.approx(0.4, abs=1e-6)
    assert "host between two steps (the loop around them): 0.4 ms" in costs.summary()


def sweep_runs() -> dict[str, History]:
    """Chunks 64, 512 and 8192 under two policies, real and twin: P95 TTFT from 5 ms to 2,000
    ms (400 times), median ITL from 10 to 12 ms."""
    runs = {}
    for chunk, ttft in ((64, 2000.0), (512, 300.0), (8192, 5.0)):
        for policy, slower in (("prefill_first", 1.0), ("decode_first", 1.2)):
            settings = dict(max_extend_tokens=chunk, policy=policy)
            itl = 10.0 if policy == "prefill_first" else 12.0
            runs[f"chunk {chunk} {policy}"] = timed_run(ttft * slower, itl, **settings)
            twin = timed_run(ttft * slower * 1.1, itl, simulated=True, **settings)
            runs[f"chunk {chunk} {policy} (twin)"] = twin
    return runs


def _encodings(spec, channel: str) -> list[dict]:
    """Every `channel` encoding in a chart's spec, wherever it is nested."""
    found = []
    if isinstance(spec, dict):
        if isinstance(spec.get("encoding"), dict) and channel in spec["encoding"]:
            found.append(spec["encoding"][channel])
        for value in spec.values():
            found += _encodings(value, channel)
    elif isinstance(spec, list):
        for value in spec:
            found += _encodings(value, channel)
    return found


def test_the_sweep_chart_shows_each_runs_figures_on_axes_that_fit_them():
    from workbench.viz import sweep_chart

    runs = sweep_runs()
    figures = ("p95 TTFT (ms)", "median ITL (ms)")
    spec = sweep_chart(runs, figures=figures).to_dict()
    data = pd.DataFrame([row for rows in spec["datasets"].values() for row in rows])
    assert len(data) == len(runs) * len(figures)
    for (run, figure), value in data.set_index(["run", "figure"]).value.items():
        assert value == pytest.approx(run_figures(runs[run])[figure]), (run, figure)
    assert set(data[data.source == "simulated"].run) == {r for r in runs if "twin" in r}
    # P95 TTFT spans 400 times: a log scale, said in its title; ITL (1.2 times) stays linear
    scales = {y["title"]: y["scale"] for y in _encodings(spec, "y")}
    assert set(scales) == {"p95 TTFT (ms), log scale", "median ITL (ms)"}
    assert scales["p95 TTFT (ms), log scale"]["type"] == "log"
    assert scales["median ITL (ms)"].get("type", "linear") == "linear"
    low, high = scales["median ITL (ms)"]["domain"]
    assert 9 < low < 10 and 12 < high < 13  # (fitted to 10-12 ms, not from 0)
    # every chunk size swept is a labelled tick
    for x in _encodings(spec, "x"):
        assert x["axis"]["values"] == [64, 512, 8192]
        assert x["axis"]["labelOverlap"] is False


def test_the_costs_print_the_unit_of_every_coefficient():
    """A path's device time and each host stage as a row, each coefficient under its unit."""
    costs = flat_costs()
    text = costs.summary()
    lines = text.splitlines()
    head = next(line for line in lines if line.lstrip().startswith("ms per"))
    for unit in ("step", "prompt step", "decode step", "request", "1k tokens", "1M pairs"):
        assert f" {unit} " in f"{head} "
    device = next(line for line in lines if line.lstrip().startswith("device "))
    assert device.split()[1:] == ["1"] * len(DEVICE_FEATURES["eager"])
    for stage in HOST_STAGES:
        row = next(line for line in lines if line.lstrip().startswith(f"host {stage} "))
        assert row.split()[2:] == ["0.01"] * len(HOST_FEATURES[stage])
    assert repr(costs) == text
