"""Inter-token latency (ITL): every gap between consecutive tokens of a request, from the first
token on, against the steps and ledger tables of a real run; and where the views show it."""

from __future__ import annotations

import threading
import time

import pandas as pd
import pytest

from workbench import Workbench
from workbench.history.latency import inter_token_latencies
from workbench.viz import compare_table
from workbench.viz.report import summary

from .conftest import PROMPTS, greedy

LONG = PROMPTS[3] * 3  # chunked under the budget below


def staggered_run(overlap: bool) -> tuple[Workbench, int]:
    """Requests of different lengths, one arriving late, one aborted while it decodes."""
    wb = Workbench("tiny-llama", max_extend_tokens=24, max_running_reqs=3, overlap=overlap)
    wb.add_request(LONG, greedy(6))
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(5))
    wb.add_request(PROMPTS[4], greedy(4), arrival_step=5)
    aborted = wb.add_request(PROMPTS[1], greedy(12))
    while len(wb.history.ledger.query(f"uid == {aborted}").token.dropna()) < 3:
        wb.step()
    wb.abort(aborted)
    wb.run(progress=False)
    return wb, aborted


@pytest.fixture(scope="module", params=[False, True], ids=["serial", "overlap"])
def staggered(request):
    return staggered_run(request.param)


def hand_gaps(steps: pd.DataFrame, ledger: pd.DataFrame) -> dict[int, list[float]]:
    """Each request's token times (its steps' completions, in step order) and their gaps."""
    done_at = {row.step: row.completed_at for row in steps.itertuples()}
    times: dict[int, list[tuple[int, float]]] = {}
    for row in ledger.itertuples():
        if not pd.isna(row.token):
            times.setdefault(row.uid, []).append((row.step, done_at[row.step]))
    gaps = {}
    for uid, pairs in times.items():
        at = [t for _, t in sorted(pairs)]
        gaps[uid] = [b - a for a, b in zip(at, at[1:])]
    return gaps


def test_itl_is_every_gap_between_a_requests_consecutive_tokens(staggered):
    wb, aborted = staggered
    history = wb.history
    itl = inter_token_latencies(history.steps, history.ledger)
    expected = hand_gaps(history.steps, history.ledger)
    got = {uid: list(gaps) for uid, gaps in itl.groupby(level="uid")}
    assert got == {uid: gaps for uid, gaps in expected.items() if gaps}
    requests = history.requests.set_index("uid")
    # one gap per token after the first; the late and the aborted request have theirs
    assert len(itl) == (requests.completion_tokens - 1).clip(lower=0).sum()
    late = int(requests.index[requests.arrival_step == 5][0])
    assert len(got[late]) == requests.completion_tokens[late] - 1 == 3
    assert requests.finish_reason[aborted] == "abort"
    assert 2 <= len(got[aborted]) < 11
    assert (itl > 0).all()


def test_a_requests_gaps_add_up_to_its_tpot_only_when_it_ends_on_its_last_token(staggered):
    wb, aborted = staggered
    history = wb.history
    itl = inter_token_latencies(history.steps, history.ledger)
    per_request = itl.groupby(level="uid").mean()
    tpot = history.requests.set_index("uid").tpot_s
    finished = [uid for uid in per_request.index if uid != aborted]
    assert per_request[finished].to_numpy() == pytest.approx(tpot[finished].to_numpy(), abs=1e-8)
    # aborted after its last token: TPOT counts the wait for the abort, ITL does not
    assert per_request[aborted] < tpot[aborted]
    # over all requests, the mean gap is TPOT weighted by each request's gaps
    weights = itl.groupby(level="uid").size()
    weighted = (tpot[finished] * weights[finished]).sum() / weights[finished].sum()
    assert itl[finished].mean() == pytest.approx(weighted, abs=1e-8)


def test_comparisons_and_the_summary_show_itl_percentiles(staggered):
    wb, _ = staggered
    history = wb.history
    gaps = [g for gaps in hand_gaps(history.steps, history.ledger).values() for g in gaps]
    table = compare_table({"run": history}, full=True)
    row = table.loc["run"]
    assert row["p50 ITL (ms)"] == round(float(pd.Series(gaps).median()) * 1e3, 2)
    assert row["p99 ITL (ms)"] == round(float(pd.Series(gaps).quantile(0.99)) * 1e3, 2)
    assert row["p50 ITL (ms)"] <= row["p90 ITL (ms)"] <= row["p99 ITL (ms)"]
    ttft_ms = history.requests.ttft_s * 1e3
    assert row["p50 TTFT (ms)"] == round(float(ttft_ms.median()), 2)
    assert row["p95 TTFT (ms)"] == round(float(ttft_ms.quantile(0.95)), 2)
    assert {"p95 TTFT (ms) ±", "p95 ITL (ms) ±"} <= set(table.columns)  # with their noise
    assert row["p90 TPOT (ms)"] == round(float(history.requests.tpot_s.quantile(0.9)) * 1e3, 2)
    new = [f"p{q} {name} (ms)" for name in ("TTFT", "TPOT", "ITL") for q in (50, 90, 95, 99)]
    kept = ["mean TTFT (steps)", "p90 TTFT (steps)", "mean steps per output token"]
    assert set(new + kept + ["mean step wall (ms)", "median TPOT (ms)"]) <= set(table.columns)
    assert summary(history)["median ITL (ms)"] == round(float(pd.Series(gaps).median()) * 1e3, 2)


def test_a_request_due_during_a_step_arrived_at_its_time_not_at_the_steps_end():
    """A request due at a time that falls while a step runs is queued when the step ends (as a
    server's waits for the step in progress), but it arrived at its time: the requests table's
    `arrival_s` is that time, and its TTFT counts the rest of that step."""
    wb = Workbench("tiny-llama", max_extend_tokens=4096, max_running_reqs=4)
    assert wb.scheduler.clock.now() == 0.0  # building the engine is not the run's time
    wb.add_request(LONG * 8, greedy(2))  # one long prompt step first (25 ms here)
    due = 0.005
    late = wb.add_request(PROMPTS[0], greedy(2), arrival_time=due)
    first = wb.step()
    assert first.size == 1 and first.completed_at > due  # it fell due while the step ran
    wb.run(progress=False)
    wb.check_integrity()
    row = wb.history.requests.set_index("uid").loc[late]
    assert row.arrival_s == pytest.approx(due, abs=1e-9)
    assert row.arrival_step == 1
    # its first token came after the long step ended and its own prompt step ran
    assert row.ttft_s >= first.completed_at - due


def test_a_new_runs_clock_reads_zero_until_its_first_step():
    """The time spent building the engine, or reconfiguring it, is not the run's: a request due
    at 1 ms must not be due on arrival because the build took longer."""
    wb = Workbench("tiny-llama", max_extend_tokens=64)
    assert wb.scheduler.clock.now() == 0.0
    wb.add_request(PROMPTS[0], greedy(1), arrival_time=0.001)
    assert wb.scheduler.is_idle and not wb.is_done  # due later, not queued on arrival
    wb.run(progress=False)
    wb.reconfigure(max_extend_tokens=32)
    assert wb.scheduler.clock.now() == 0.0
    wb.check_integrity()


def test_a_request_due_far_ahead_is_waited_for_not_an_overflow():
    """A run waits for a request due in 1e12 s (time.sleep alone overflows past the platform's
    time_t: every run() raised OverflowError until it was aborted); a paused clock's wait ends."""
    from workbench.clocks import RunClock

    errors = []
    hook, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)
    try:
        wb = Workbench("tiny-llama")
        wb.add_request(PROMPTS[0], greedy(2))
        wb.add_request(PROMPTS[1], greedy(2), arrival_time=1e12)
        waiting = threading.Thread(target=wb.run, kwargs=dict(progress=False), daemon=True)
        waiting.start()
        waiting.join(timeout=5.0)
        assert waiting.is_alive() and not errors, errors  # still waiting, no OverflowError
    finally:
        threading.excepthook = hook
    clock = RunClock()
    clock.pause()
    started = time.perf_counter()
    clock.wait_until(clock.now() + 0.05)
    assert time.perf_counter() - started < 5.0
