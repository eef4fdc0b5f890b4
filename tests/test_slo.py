"""Goodput and SLOs: each request's verdict, goodput and attainment against a hand computation
(on a twin whose every step's time is known, and on a real model's run), why each missed
request missed (causes that add up to its delay), the chart, `compare_table(slo=...)`,
`bench --slo`, and bad SLOs refused naming the key."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from workbench import SamplingParams, Workbench, load_run, viz
from workbench.clocks import HOST_STAGES
from workbench.history.misses import CAUSES, miss_causes, misses_by_cause
from workbench.history.slo import SLO_KEYS, check_slo, slo_figures, slo_verdicts
from workbench.policies import POLICIES
from workbench.twin.costs import Linear, StepCosts
from workbench.twin.features import DEVICE_FEATURES, HOST_FEATURES
from workbench.viz import charts, compare_table

from .conftest import shared

MODEL = "tiny-qwen3"


def known_costs() -> StepCosts:
    """A step that computes prompt tokens takes 30 ms, one that only decodes 10 ms; the host
    takes nothing: a twin's run on these has timings known by hand."""
    zero = {s: Linear(HOST_FEATURES[s], (0.0,) * len(HOST_FEATURES[s])) for s in HOST_STAGES}
    return StepCosts(
        meta={
            "model": "tiny-llama",
            "device": "cpu",
            "device_name": "cpu",
            "dtype": "float32",
            "tp_size": 1,
            "num_pages": 4096,
            "page_size": 1,
            "runs": ["known"],
            "steps": 0,
        },
        device={"eager": Linear(DEVICE_FEATURES["eager"], (30.0, 10.0, 0, 0, 0, 0, 0))},
        host={"eager": zero},
        between_ms=0.0,
    )


def known_run(policy: str, max_running_reqs: int = 4, late: bool = True, max_tokens: int = 5):
    """Three prompts of 10 tokens at time 0 and (`late`) a fourth at step 2, `max_tokens` each."""
    wb = Workbench(
        "tiny-llama", step_costs=known_costs(), policy=policy, max_running_reqs=max_running_reqs
    )
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i in range(3):
        wb.add_request([5 + i] * 10, sampling)
    if late:
        wb.add_request([9] * 10, sampling, arrival_step=2)
    wb.run(progress=False)
    return wb.history


def only(row) -> dict:
    """A miss_causes row's causes that held it up."""
    return {c: round(row[c], 6) for c in CAUSES if row[c] > 0}


def test_goodput_and_causes_on_a_run_of_known_timings():
    # prefill_first: steps 0 prefill (30 ms), 1 decode, 2 the late prompt alone (30 ms: the
    # others wait), 3-5 decode four, 6 the late one's last: requests 0-2 have their tokens at
    # 30, 40, 80, 90, 100 ms, request 3 (arrived at 40) at 70, 80, 90, 100, 110 ms
    history = known_run("prefill_first")
    v = slo_verdicts(history, {"ttft_ms": 35, "tpot_ms": 15})
    assert np.allclose(v.ttft_ms, [30, 30, 30, 30])
    assert np.allclose(v.tpot_ms, [17.5, 17.5, 17.5, 10])  # (E2E - TTFT) / (n - 1)
    assert np.allclose(v.itl_ms, [40, 40, 40, 10]) and np.allclose(v.e2e_ms, [100, 100, 100, 70])
    assert v.good.tolist() == [False, False, False, True]
    assert v.missed.tolist() == ["tpot", "tpot", "tpot", ""]
    figures = slo_figures(history, {"ttft_ms": 35, "tpot_ms": 15})
    assert figures == {
        "goodput (req/s)": round(1 / 0.110, 3),  # one good request over 0 to 110 ms
        "SLO attainment (%)": 25.0,
        "TTFT SLO pass (%)": 100.0,
        "TPOT SLO pass (%)": 25.0,
    }
    assert slo_figures(history, {"itl_ms": 40, "e2e_ms": 100})["SLO attainment (%)"] == 100.0
    causes = miss_causes(history, {"ttft_ms": 35, "tpot_ms": 15})
    assert causes.uid.tolist() == [0, 1, 2] and np.allclose(causes.delay_ms, 70)  # 30 to 100
    for _, row in causes.iterrows():  # the late prompt's step held their decodes 30 ms
        assert only(row) == {"decode": 40.0, "decode paused for prefill": 30.0}
    by_cause = misses_by_cause(history, {"ttft_ms": 35, "tpot_ms": 15})
    assert by_cause.cause.tolist() == ["decode", "decode paused for prefill"]
    assert np.allclose(by_cause.ms, [120, 90]) and by_cause.requests.tolist() == [3, 3]


def test_a_one_token_request_has_no_tpot_or_itl_and_misses_neither_limit():
    """TPOT and ITL are gaps between tokens: a request of one token has none. Its verdict says
    NaN, as the requests table's `tpot_s` does, and counts neither limit against it."""
    history = known_run("prefill_first", late=False, max_tokens=1)
    v = slo_verdicts(history, {"ttft_ms": 35, "tpot_ms": 1, "itl_ms": 1})
    assert v.tpot_ms.isna().all() and history.requests.tpot_s.isna().all()
    assert v.itl_ms.isna().all() and np.allclose(v.ttft_ms, 30)
    assert v.good.all() and v.tpot_ok.all() and v.itl_ok.all() and (v.missed == "").all()
    assert slo_figures(history, {"tpot_ms": 1})["SLO attainment (%)"] == 100.0
    assert miss_causes(history, {"tpot_ms": 1, "itl_ms": 1}).empty


@pytest.mark.parametrize(
    ("policy", "slo", "expected"),
    [
        # mixed: the late prompt shares step 2 (30 ms) with three decodes: 10 ms of decoding
        # (a decode step's), 20 ms slowed by the prompt; TPOT (90 - 30) / 4 = 15
        ("mixed", {"tpot_ms": 12}, {0: {"decode": 40.0, "decode slowed by prefill": 20.0}}),
        # decode_first: the late prompt waits for the decodes (steps 2-4), then its prefill
        ("decode_first", {"ttft_ms": 50}, {3: {"queued: decode_first": 30.0, "prefill": 30.0}}),
    ],
)
def test_each_cause_is_the_time_the_schedule_gave_it(policy, slo, expected):
    causes = miss_causes(known_run(policy), slo).set_index("uid")
    for uid, held in expected.items():
        assert only(causes.loc[uid]) == held
        assert causes.loc[uid].delay_ms == pytest.approx(sum(held.values()))


def test_a_request_refused_a_slot_is_queued_for_that_reason():
    # two slots: request 2 waits through steps 0-2 (prefill 30, decodes 10, 10) for one
    history = known_run("prefill_first", max_running_reqs=2, late=False, max_tokens=3)
    causes = miss_causes(history, {"ttft_ms": 50}).set_index("uid")
    assert causes.index.tolist() == [2]
    assert only(causes.loc[2]) == {"queued: no_slot": 50.0, "prefill": 30.0}


def real_run(policy: str):
    """tiny-qwen3, chunked prompts (budget 32) arriving a step apart, three slots."""
    wb = shared(lambda: Workbench(MODEL, max_extend_tokens=32, max_running_reqs=3), "slo")
    wb.reset()
    wb.reconfigure(policy=policy)
    rng = random.Random(0)
    for i in range(8):
        ids = [rng.randrange(100, 5000) for _ in range(rng.randint(8, 70))]
        sampling = SamplingParams(max_tokens=rng.randint(1, 10), ignore_eos=True)
        wb.add_request(ids, sampling, arrival_step=i // 2)
    wb.run(progress=False)
    wb.check_integrity()
    return wb


def latencies_by_hand(history) -> list[dict[str, float]]:
    """Each request's TTFT, TPOT, largest ITL and E2E (ms), from the ledger and the steps'
    completion times alone, as vLLM's --goodput defines them."""
    done = dict(zip(history.steps.step, history.steps.completed_at))
    ledger = history.ledger[history.ledger.token.notna()]
    out = []
    for r in history.requests.itertuples():
        times = sorted(done[s] for s in ledger.step[ledger.uid == r.uid])
        ttft, e2e = (times[0] - r.arrival_s) * 1e3, (times[-1] - r.arrival_s) * 1e3
        n = len(times)
        out.append(
            {
                "ttft_ms": ttft,
                "tpot_ms": (e2e - ttft) / (n - 1) if n > 1 else 0.0,
                "itl_ms": max(np.diff(times) * 1e3, default=0.0),
                "e2e_ms": e2e,
            }
        )
    return out


def by_hand(history, slo: dict) -> tuple[list[bool], float]:
    """Each request's verdict and the goodput (`latencies_by_hand`)."""
    latencies = latencies_by_hand(history)
    good = [all(latency[k] <= limit for k, limit in slo.items()) for latency in latencies]
    requests = history.requests
    span = requests.finish_s.max() - requests.arrival_s.min()
    return good, sum(good) / span


def slo_around_the_median_request(history) -> dict[str, float]:
    """An SLO that the request of median TTFT just meets and those of longer TTFT miss: each
    limit halfway between that request's value and the next larger one of any request, so
    that no request sits on a limit (where a rounding apart would decide its verdict)."""
    latencies = latencies_by_hand(history)
    ttfts = [x["ttft_ms"] for x in latencies]
    chosen = latencies[int(np.argsort(ttfts)[len(ttfts) // 2])]
    slo = {}
    for key in ("ttft_ms", "tpot_ms", "itl_ms"):
        above = [x[key] for x in latencies if x[key] > chosen[key]]
        slo[key] = (chosen[key] + min(above)) / 2 if above else chosen[key] + 1.0
    return slo | {"e2e_ms": 1e9}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_on_a_real_run_goodput_is_the_hand_computation_and_causes_add_up(policy):
    wb = real_run(policy)
    history = wb.history
    assert (history.steps.chunk_tokens > 0).any()
    r = history.requests
    slo = slo_around_the_median_request(history)
    good, goodput = by_hand(history, slo)
    v = slo_verdicts(history, slo)
    assert v.good.tolist() == good and 0 < sum(good) < len(good)
    figures = slo_figures(history, slo)
    assert figures["goodput (req/s)"] == pytest.approx(goodput, abs=1e-3)
    assert figures["SLO attainment (%)"] == pytest.approx(100 * sum(good) / len(good), abs=0.05)
    causes = miss_causes(history, slo)
    assert set(causes.uid) == {u for u, g in zip(r.uid, good) if not g}
    for _, row in causes.iterrows():  # every missed request's causes add up to its delay
        assert row[list(CAUSES)].sum() == pytest.approx(row.delay_ms, rel=0.05), row.uid
    assert (causes[list(CAUSES)] >= 0).all().all()
    # the run's total by cause, the chart, and the comparison table say the same
    by_cause = misses_by_cause(history, slo)
    assert by_cause.ms.sum() == pytest.approx(causes.delay_ms.sum(), rel=0.05)
    spec = viz.slo_misses(history, slo).to_dict()
    drawn = [d for d in spec["datasets"].values() if d and "cause" in d[0]]
    assert {row["cause"] for row in drawn[0]} == set(by_cause.cause)
    table = compare_table({"run": wb.snapshot()}, slo=slo)
    assert table.loc["run", "goodput (req/s)"] == figures["goodput (req/s)"]
    assert table.loc["run", "ITL SLO pass (%)"] == figures["ITL SLO pass (%)"]


def test_the_chart_shows_for_a_history_that_carries_an_slo():
    wb = real_run("prefill_first")
    run = wb.snapshot()
    chart = charts.BY_NAME["slo_misses"]
    assert not chart.applies(run)
    assert "no SLO" in json.dumps(chart.draw(run).to_dict())  # drawn all the same
    run.meta["slo"] = {"ttft_ms": 1.0}
    assert chart.applies(run)
    assert "Why requests missed the SLO" in chart.draw(run, None, 0).to_dict()["title"]


@pytest.mark.parametrize(
    ("slo", "error", "match"),
    [
        ({"ttft": 500}, ValueError, "slo key 'ttft' is not one of .*ttft_ms.*e2e_ms"),
        ({"ttft_ms": 500, "latency_ms": 9}, ValueError, "slo key 'latency_ms'"),
        ({"tpot_ms": -1}, ValueError, r"slo\['tpot_ms'\]"),
        ({"tpot_ms": "50"}, TypeError, r"slo\['tpot_ms'\]"),
        ({}, ValueError, "slo is empty"),
        ([("ttft_ms", 5)], TypeError, "slo must be a mapping"),
    ],
)
def test_a_bad_slo_is_refused_naming_the_key_and_the_keys_allowed(slo, error, match):
    with pytest.raises(error, match=match):
        check_slo(slo)
    with pytest.raises(error, match=match):
        compare_table({}, slo=slo)  # before any run is read
    assert SLO_KEYS == ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def bench(*flags: str) -> subprocess.CompletedProcess:
    small = ["--num-requests", "6", "--input-len", "8", "40", "--output-len", "2", "12"]
    cmd = [sys.executable, "-m", "workbench", "bench", *small, *flags]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.mark.slow  # a whole bench (~13 s); goodput's figures stay in make test
def test_bench_slo_prints_goodput_and_the_misses_by_cause(tmp_path):
    done = bench("--slo", "ttft:1,tpot:1", "--max-extend-tokens", "16", "--save", str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "SLO ttft 1 ms, tpot 1 ms: goodput 0.000 req/s, attainment 0.0%" in out
    assert "misses by cause (6 requests missed" in out and "prompt in chunks" in out
    run = load_run(tmp_path / "run.parquet")  # recorded light: --slo reads the records
    assert run.meta["record"] == "light" and run.meta["slo"] == {"ttft_ms": 1.0, "tpot_ms": 1.0}
    assert charts.BY_NAME["slo_misses"].applies(run)
    for flag, said in [("ttft:x", "'x' is not a number"), ("foo:3", "'foo:3': each limit is")]:
        done = bench("--slo", flag)
        assert done.returncode == 2 and said in done.stderr and "ttft" in done.stderr
