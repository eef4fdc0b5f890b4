"""What the views show, checked against figures worked out by hand: each chart's inline data
(its Vega-Lite spec's "datasets") by series name, the dashboard's status line, the comparison
table's throughput. The figures come from a made-up run whose every number is chosen apart from
its neighbours' (so a series, a column or a row read in place of another shows), and from a tiny
real run whose first prompt is longer than the token budget (so it is computed in chunks)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from workbench import Workbench, viz
from workbench.clocks import HOST_STAGES
from workbench.core import ReqView
from workbench.history.history import History
from workbench.history.latency import run_figures
from workbench.scheduler.record import KVState, StepRecord
from workbench.viz.dashboard import Dashboard

from .conftest import greedy

# -- a made-up run ----------------------------------------------------------------------------
#
# step  phase    batch (uid kind tokens)            queue  running  KV free/evictable/in use  s
# 0     prefill  #0 prefill 3, #1 prefill 4             0        2        80 / 13 /  7   0.10-0.20
# 1     decode   #0, #1                                 0        2        70 / 21 /  9   0.25-0.30
# 2     prefill  #2 prefill 5 (#2, #3 came at 0.31 s)   1        3        60 / 26 / 14   0.32-0.40
# 3     mixed    #0, #1, #2 decode, #3 prefill 6        0        0        50 / 27 / 23   0.45-0.55
#
# Every request finishes in step 3 ("length"): #0 and #1 with 3 tokens, #2 with 2, #3 with 1.
# Step s spends s + 1 + i / 8 ms in the i-th host stage (`HOST_STAGES` order). The history has
# no meta, so it reads as a GPU run's: every host stage is the host's own work.

KV_TOTAL = 100
ARRIVALS = {0: (0, 0.00, 3, 3), 1: (0, 0.02, 4, 3), 2: (2, 0.31, 5, 2), 3: (2, 0.31, 6, 1)}


def prefill(uid: int, tokens: int) -> ReqView:
    """Request `uid` computing its whole prompt of `tokens` tokens."""
    prompt, max_tokens = ARRIVALS[uid][2:]
    return ReqView(uid, "prefill", uid, 0, tokens, prompt + max_tokens, tokens, 0)


def decode(uid: int, start: int) -> ReqView:
    """Request `uid` computing the token at position `start`."""
    prompt, max_tokens = ARRIVALS[uid][2:]
    return ReqView(uid, "decode", uid, start, start + 1, prompt + max_tokens, 1, 0)


# the table above, column by column
BATCHES = [
    [prefill(0, 3), prefill(1, 4)],
    [decode(0, 3), decode(1, 4)],
    [prefill(2, 5)],
    [decode(0, 4), decode(1, 5), decode(2, 5), prefill(3, 6)],
]
QUEUE = [0, 0, 1, 0]
RUNNING = [2, 2, 3, 0]
KV = [(80, 13), (70, 21), (60, 26), (50, 27)]  # free, evictable
TIMES = [(0.10, 0.20), (0.25, 0.30), (0.32, 0.40), (0.45, 0.55)]  # launched, completed


def stage_ms(step: int) -> dict[str, float]:
    """The made-up host time of each stage of `step`: distinct in the step and across steps."""
    return {stage: step + 1 + i / 8 for i, stage in enumerate(HOST_STAGES)}


def record(step: int) -> StepRecord:
    """Step `step` of the table above: every row that is not a chunk got a token."""
    views, (launched, completed) = BATCHES[step], TIMES[step]
    kinds = {v.kind == "decode" for v in views}
    phase = "mixed" if len(kinds) == 2 else "decode" if True in kinds else "prefill"
    stages = tuple(stage_ms(step).values())
    return StepRecord(
        step=step,
        phase=phase,
        _launched=tuple(zip(*views)),
        _tokens=tuple(100 + v.uid for v in views if v.kind != "chunk"),
        _finishes=tuple((uid, "length") for uid in ARRIVALS) if step == 3 else (),
        _admissions=(),
        _behind=(),
        _behind_reason="queued_behind",
        queue_len=QUEUE[step],
        running=RUNNING[step],
        kv=KVState(*KV[step], in_use=KV_TOTAL - sum(KV[step]), total=KV_TOTAL),
        free_slots=8 - RUNNING[step],
        padded_size=len(views),
        cuda_graph=False,
        overlapped=False,
        launched_at=launched,
        completed_at=completed,
        device_ms=1.0,
        host_ms=sum(stages),
        host_stage_ms=stages,
    )


@pytest.fixture(scope="module")
def made_up() -> History:
    history = History()
    for uid, arrival in ARRIVALS.items():
        history.arrive(uid, *arrival)
    for step in range(len(BATCHES)):
        history.append(record(step))
    return history


# -- a tiny real run ---------------------------------------------------------------------------

LONG, SHORT = list(range(1, 41)), list(range(50, 55))  # token ids: 40 and 5 prompt tokens


@pytest.fixture(scope="module")
def real_runs() -> dict:
    """The long prompt (at step 0) and the short one (at step 1), in chunks of 16 and of 8."""
    settings = {f"chunks of {n}": dict(max_extend_tokens=n) for n in (16, 8)}
    requests = [(LONG, greedy(4), 0), (SHORT, greedy(4), 1)]
    with Workbench("tiny-qwen3", max_extend_tokens=16) as wb:
        return wb.compare(settings, requests, progress=False)


def data_rows(chart, field: str) -> list[dict]:
    """The rows of the chart's inline data that have `field`."""
    spec = chart.to_dict()
    return [row for rows in spec["datasets"].values() for row in rows if field in row]


def series(chart, name: str, value: str) -> dict[tuple, float]:
    """The chart's `value` by (step, series), its series told apart by the field `name`."""
    return {(row["bin"], row[name]): row[value] for row in data_rows(chart, name)}


# -- 1. the KV pool ----------------------------------------------------------------------------


def test_kv_usage_draws_each_steps_slots_under_their_own_state(made_up):
    """The KV chart's "free", "evictable" and "in use" series hold, at each step, that step's
    `kv_free`, `kv_evictable` and `kv_in_use`."""
    steps = made_up.steps
    assert (steps.kv_free != steps.kv_evictable).all()  # else a swap would not show
    columns = {"free": "kv_free", "evictable": "kv_evictable", "in use": "kv_in_use"}
    expected = {
        (step, state): n
        for state, column in columns.items()
        for step, n in zip(steps.step, steps[column])
    }
    assert series(viz.kv_usage(made_up), "state", "tokens") == expected


# -- 2. batch composition ----------------------------------------------------------------------


def test_a_prompt_longer_than_the_budget_is_computed_in_chunks(real_runs):
    """40 prompt tokens with a budget of 16: chunks of 16 at steps 0 and 1, then the last 8 as
    a prefill at step 2 (which samples its first token)."""
    ledger = real_runs["chunks of 16"].ledger
    first = ledger[(ledger.uid == 0) & (ledger.step < 3)]
    assert list(zip(first.step, first.kind, first.extend_len)) == [
        (0, "chunk", 16),
        (1, "chunk", 16),
        (2, "prefill", 8),
    ]


@pytest.mark.parametrize("label", ["chunks of 16", "chunks of 8"])
def test_batch_composition_draws_each_steps_tokens_under_their_ledger_kind(real_runs, label):
    """Per step and kind, the tokens the chart stacks are the ledger's `extend_len` of that kind
    summed: a chunk's tokens under "chunk", not "prefill"; no padding on the CPU."""
    history = real_runs[label]
    expected = defaultdict(int)
    for entry in history.ledger.itertuples():
        expected[(entry.step, entry.kind)] += entry.extend_len
    drawn = defaultdict(int)
    for row in data_rows(viz.batch_composition(history), "kind"):
        drawn[(row["bin"], row["kind"])] += row["tokens"]
    assert {key: n for key, n in drawn.items() if n} == expected


# -- 3. comparing runs -------------------------------------------------------------------------


@pytest.mark.parametrize("unit", ["steps", "ms"])
def test_compare_charts_first_panel_is_each_requests_ttft(real_runs, unit):
    """The first panel's bar for (run, request) is that request's TTFT: in steps, from its
    arrival to its first token, that step included; in ms, `ttft_s` of the requests table."""
    expected = {}
    for label, history in real_runs.items():
        for r in history.requests.itertuples():
            steps = r.first_token_step - r.arrival_step + 1
            expected[(label, r.uid)] = steps if unit == "steps" else r.ttft_s * 1e3
    spec = viz.compare_chart(real_runs, unit=unit).to_dict()
    panel = spec["vconcat"][0]
    y = panel["encoding"]["y"]["field"]
    drawn = {(row["run"], row["uid"]): row[y] for row in spec["datasets"][panel["data"]["name"]]}
    assert drawn == pytest.approx(expected)


def test_the_real_runs_ttft_in_steps_tell_the_runs_and_requests_apart(real_runs):
    """In chunks of 16 the long prompt's first token comes at step 2, 3 steps after it came,
    and the short prompt (at step 1) rides along; in chunks of 8 the long one takes 5 steps,
    and the short one waits for the budget until step 5."""
    ttft = {
        (label, r.uid): r.first_token_step - r.arrival_step + 1
        for label, history in real_runs.items()
        for r in history.requests.itertuples()
    }
    assert ttft == {
        ("chunks of 16", 0): 3,
        ("chunks of 16", 1): 2,
        ("chunks of 8", 0): 5,
        ("chunks of 8", 1): 5,
    }


# -- 4. the dashboard --------------------------------------------------------------------------

STATUS = re.compile(
    r"<b>step (\d+)</b> of \d+ · (\w+) · (\d+) requests? · (\d+) tokens? · "
    r"queue (\d+) · running (\d+) · KV free (\d+)/"
)


def test_dashboard_status_describes_the_step_in_focus(made_up):
    """With the slider on a step, the status line gives that step's own phase, batch size,
    tokens, queue, running set and free KV (step 2 differs from both neighbours in each)."""
    expected = {
        0: ("prefill", 2, 7, 0, 2, 80),
        1: ("decode", 2, 2, 0, 2, 70),
        2: ("prefill", 1, 5, 1, 3, 60),
        3: ("mixed", 4, 9, 0, 0, 50),
    }
    dash = Dashboard(made_up)
    for step, facts in expected.items():
        dash.slider.value = step
        shown = STATUS.search(dash.status.value)
        assert shown is not None, dash.status.value
        assert (int(shown[1]), shown[2], *map(int, shown.groups()[2:])) == (step, *facts)


# -- 5. host time by stage ---------------------------------------------------------------------


def test_steps_table_puts_each_host_stage_in_its_own_column(made_up):
    """`host_<stage>_ms` is the record's time for that stage, for every stage and step."""
    steps = made_up.steps.set_index("step")
    for step in steps.index:
        columns = {stage: steps.loc[step, f"host_{stage}_ms"] for stage in HOST_STAGES}
        assert columns == stage_ms(step)


def test_step_times_draws_each_host_stage_under_its_own_name(made_up):
    """The step-time chart's bar for a stage at a step is that stage's time at that step."""
    expected = {(step, stage): ms for step in range(4) for stage, ms in stage_ms(step).items()}
    assert series(viz.step_times(made_up), "stage", "ms") == expected


# -- 6. throughput -----------------------------------------------------------------------------


def test_compare_table_output_tokens_per_second_is_from_the_first_arrival_to_the_last_finish(
    made_up,
):
    """9 tokens came out between the first arrival (0.00 s) and the last finish (0.55 s): 16.4
    tokens/s, vLLM's output throughput, and the twin's "throughput (tok/s)" alike. (From the
    first launch, 0.10 s, it would be 20.0; over the steps' wall times, 0.33 s, 27.3; of all 23
    tokens computed, 51.1.)"""
    assert made_up.requests.completion_tokens.sum() == 9
    table = viz.compare_table({"made up": made_up})
    assert table.loc["made up", "output tokens/s"] == 16.4
    assert run_figures(made_up)["throughput (tok/s)"] == pytest.approx(9 / 0.55)
