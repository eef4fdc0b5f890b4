"""Scheduling policies: prefill_first, decode_first and mixed (stall-free) batches.

Each policy must give Hugging Face's greedy tokens (the batches differ, the tokens must not), and
its batches must have the shape the policy promises, with requests arriving while others decode.
"""

from __future__ import annotations

import re

import pytest

from workbench import Workbench
from workbench.core import DECODE_FIRST
from workbench.viz import compare_chart, compare_summary, compare_table, request_latencies
from workbench.viz.causes import queued_phrase, run_causes
from workbench.viz.compare import SHORT

from .conftest import PROMPTS, greedy, hf_greedy, shared

LONG = PROMPTS[3] * 3  # about 75 tokens: several chunks under a small budget


def staggered(wb: Workbench, max_new: int) -> list[list[int]]:
    """Requests that arrive while earlier ones are decoding, one of them long; the token ids."""
    prompts = [PROMPTS[0], LONG, PROMPTS[1], PROMPTS[2], PROMPTS[4], PROMPTS[3]]
    arrivals = [None, 2, 3, 3, 9, 14]
    ids = [wb.llm.encode(p) for p in prompts]
    for p, step in zip(ids, arrivals):
        wb.add_request(p, greedy(max_new), arrival_step=step)
    return ids


def _settings():
    """Every model x (page size, overlap) x budget x policy; SmolLM2 (8-25 s each on the CPU)
    in `make test` with the mixed policy under a budget of 24 tokens, the rest with `-m slow`,
    the tiny model covering every case in `make test`."""
    for model in ("tiny-qwen3", "smollm2"):
        for page_size, overlap in ((1, False), (4, True)):
            for budget in (5, 24):
                for policy in ("prefill_first", "decode_first", "mixed"):
                    slow = model == "smollm2" and (budget, policy) != (24, "mixed")
                    marks = [pytest.mark.slow] if slow else []
                    yield pytest.param(model, page_size, overlap, budget, policy, marks=marks)


@pytest.mark.parametrize("model, page_size, overlap, budget, policy", list(_settings()))
def test_every_policy_matches_hf(model, page_size, overlap, budget, policy):
    """One engine per model and page size; policy, budget and overlap are the scheduler's."""
    max_new = 8 if model == "smollm2" else 12
    wb = shared(lambda: Workbench(model, page_size=page_size, max_running_reqs=4), model, page_size)
    wb.reset()
    wb.reconfigure(policy=policy, max_extend_tokens=budget, overlap=overlap)
    ids = staggered(wb, max_new)
    records = wb.run(progress=False)
    wb.check_integrity()
    assert [o["token_ids"] for o in wb.outputs()] == hf_greedy(model, ids, max_new)
    phases = {r.phase for r in records}
    if policy == "mixed" and budget > 4:  # room for a chunk beside the decodes
        assert "mixed" in phases
    else:
        assert "mixed" not in phases


def _run(policy: str, budget: int = 16) -> list:
    wb = Workbench("tiny-llama", policy=policy, max_extend_tokens=budget, max_running_reqs=4)
    staggered(wb, 10)
    records = wb.run(progress=False)
    wb.check_integrity()
    return records


def test_mixed_batches_decode_everyone_then_fill_the_budget_with_chunks():
    records = _run("mixed", budget=16)
    mixed = [r for r in records if r.phase == "mixed"]
    assert mixed
    for rec in mixed:
        kinds = [row.kind for row in rec.rows]
        n = kinds.count("decode")
        assert 0 < n < len(kinds) and kinds[:n] == ["decode"] * n  # decodes lead
        assert all(row.extend_len == 1 for row in rec.rows[:n])
        assert rec.num_tokens <= 16
    # stall-free: no step runs prefill alone while a request was running before it
    for before, rec in zip(records, records[1:]):
        if rec.phase == "prefill":
            assert before.running == 0


def test_decode_first_admits_only_when_nothing_runs():
    records = _run("decode_first")
    refused = [a for r in records for a in r.admissions if a.reason == DECODE_FIRST]
    assert refused  # requests arrived while others decoded, and waited with that reason
    # one decision per waiting request and step; a prompt held back part-way through its
    # chunks still says how much of it is computed
    for rec in records:
        uids = [a.uid for a in rec.admissions]
        assert len(uids) == len(set(uids))
    assert any(a.cached_len > 0 for a in refused)
    for before, rec in zip(records, records[1:]):
        if rec.phase == "prefill":
            assert before.running == 0
    assert {r.phase for r in records} == {"prefill", "decode"}


def test_policies_trade_first_token_latency_against_steps():
    """decode_first holds arrivals back (later first tokens, in steps); mixed never stalls a
    running request (one step per output token), where prefill_first pauses them for prefills."""
    reqs = {}
    for policy in ("prefill_first", "decode_first", "mixed"):
        wb = Workbench("tiny-llama", policy=policy, max_extend_tokens=16, max_running_reqs=4)
        staggered(wb, 10)
        wb.run(progress=False)
        reqs[policy] = wb.history.requests
    ttft = {p: (r.first_token_step - r.arrival_step).mean() for p, r in reqs.items()}
    assert ttft["decode_first"] > ttft["prefill_first"]
    steps_per_token = {
        p: ((r.finish_step - r.first_token_step) / (r.completion_tokens - 1)).mean()
        for p, r in reqs.items()
    }
    assert steps_per_token["mixed"] == steps_per_token["decode_first"] == 1.0
    assert steps_per_token["prefill_first"] > 1.0


def test_compare_views_read_the_runs():
    runs = {}
    for policy in ("prefill_first", "mixed"):
        wb = Workbench("tiny-llama", policy=policy, max_extend_tokens=16, max_running_reqs=4)
        staggered(wb, 6)
        wb.run(progress=False)
        runs[policy] = wb.history
    table = compare_table(runs)
    assert list(table.index) == ["prefill_first", "mixed"]
    # the default view: short, one name a quantity, each figure followed by its spread if any
    figures = [c for c in table.columns if not c.endswith(" ±")]
    assert figures == [*SHORT, "repeats"]
    assert all(c.removesuffix(" ±") in SHORT for c in table.columns if c.endswith(" ±"))
    full = compare_table(runs, full=True)  # every figure, the short view's among them
    assert table.equals(full[list(table.columns)])
    assert (full["output tokens"] == 36).all()
    assert table.loc["mixed", "mixed steps"] > 0
    assert table.loc["prefill_first", "mixed steps"] == 0
    lat = request_latencies(runs["mixed"])
    r = runs["mixed"].requests
    assert (lat.ttft_steps == r.first_token_step - r.arrival_step + 1).all()
    assert (lat.ttft_steps >= 1).all()
    assert table.loc["mixed", "mean TTFT (steps)"] == round(lat.ttft_steps.mean(), 2)
    assert not any(c.endswith("ms/step") for c in full.columns)  # no profile with "light"
    spec = compare_chart(runs).to_dict()
    assert len(spec["vconcat"]) == 3
    assert "http" not in str(spec["datasets"])  # data inline, nothing to fetch
    with pytest.raises(ValueError, match="unit"):
        compare_chart(runs, unit="hours")


def test_profiled_runs_compare_by_kernel_family():
    runs = {}
    for budget in (4, 64):
        wb = Workbench("tiny-llama", record="full", max_extend_tokens=budget, max_running_reqs=4)
        for p in PROMPTS[:3]:
            wb.add_request(p, greedy(3))
        wb.run(progress=False)
        runs[f"chunk {budget}"] = wb.history
    table = compare_table(runs, full=True)
    families = [c for c in table.columns if c.endswith("ms/step") and not c.endswith("±")]
    assert {"attention ms/step", "matmul ms/step", "between kernels ms/step"} <= set(families)
    assert (table[families] >= 0).all().all() and (table["matmul ms/step"] > 0).all()
    # every step profiled: the families, the time between kernels and the idle rest add up to
    # each step's span (workbench.timing), so their means add up to the mean span
    for label, history in runs.items():
        assert table.loc[label, families].sum() == pytest.approx(
            history.steps.span_ms.mean(), abs=0.01
        )


def test_compare_summary_names_each_winner_and_the_causes_in_the_records():
    """compare_summary's winners are the table's, and its causes are the records': the time
    queued adds up, request by request, to the steps from its arrival to its prompt's last chunk
    that did not admit it (each refusal with its reason); decode_first's requests wait for the
    decodes; prefill steps pause running decodes under prefill_first and never under mixed."""
    runs = {}
    for policy in ("prefill_first", "decode_first", "mixed"):
        wb = Workbench("tiny-llama", policy=policy, max_extend_tokens=16, max_running_reqs=4)
        staggered(wb, 6)
        wb.run(progress=False)
        runs[policy] = wb.history
    table, sentences = compare_table(runs), compare_summary(runs)
    causes = {label: run_causes(history) for label, history in runs.items()}
    for label, history in runs.items():
        r, wall_ms = history.requests, history.steps.set_index("step").wall_ms
        admitted = history.admissions[history.admissions.admitted.astype(bool)]
        waited = [  # every step from its arrival to its prompt's last chunk that did not admit it
            wall_ms[step]
            for uid, arrival, last in zip(r.uid, r.arrival_step, r.first_token_step)
            for step in range(arrival, last + 1)
            if step not in set(admitted.step[admitted.uid == uid])
        ]
        assert causes[label].queued_s == pytest.approx(sum(waited) / 1e3)
        assert table.loc[label, "queued (s)"] == round(causes[label].queued_s, 3)
    assert max(causes["decode_first"].queued_ms, key=causes["decode_first"].queued_ms.get) == (
        DECODE_FIRST
    )
    assert causes["prefill_first"].paused_steps > 0 and causes["mixed"].paused_steps == 0
    said = {s.split(" is ")[0].split(" ties")[0]: s for s in sentences}
    for title, column, best, worst in [
        ("Throughput", "output tokens/s", "idxmax", "idxmin"),
        ("Time to first token", "p50 TTFT (ms)", "idxmin", "idxmax"),
        ("Inter-token latency", "p50 ITL (ms)", "idxmin", "idxmax"),
    ]:
        values, spreads = table[column], table[f"{column} ±"]
        b, w = getattr(values, best)(), getattr(values, worst)()
        beyond = abs(values[b] - values[w]) > spreads[b] + spreads[w]
        # a winner is named exactly when the best and worst differ beyond their noise
        assert (" ties within noise" not in said[title]) == beyond, said[title]
        if beyond:  # "is lowest with A (...) (and B (...)) and highest with C (...)" (then p99's)
            first, second = re.findall(r"(?:lowest|highest) with (.+?) \(", said[title])[:2]
            assert first.startswith(b) and second.startswith(w), said[title]
    # NOTE: whether decode_first is the best or the worst by TTFT is the host's timing; when the
    # sentence names it, its cause is the wait for the running decodes
    ttft = said["Time to first token"]
    if " with decode_first (" in ttft:
        assert "for the running decodes (decode_first)" in ttft
    assert "for the running decodes (decode_first)" in queued_phrase(causes["decode_first"])
    (host,) = [s for s in sentences if s.startswith("Host-bound steps")]
    assert "on the CPU the device's work is the forward and sampling" in host
    assert all(f"{label} {c.host_bound} of {c.steps}" in host for label, c in causes.items())
    (one,) = compare_summary({"mixed": runs["mixed"]})  # one run: described, nothing to rank
    assert one.startswith("mixed: ") and f"{causes['mixed'].steps} steps" in one


def shortest_first(state):
    """A policy for the test below: prompts by length, shortest first; decodes otherwise."""
    from workbench.core import Admissions, Batch

    if state.queue and not state.running:
        state.queue.sort(key=lambda p: p.prompt_len)  # the scheduler's own queue, reordered
        reqs, admissions = state.admit(state.max_extend_tokens)
        if reqs:
            return Batch(reqs, "prefill"), admissions
    if state.running:
        return Batch(state.running, "decode"), Admissions()
    return None, Admissions()


def test_a_policy_added_in_one_line_is_accepted_and_run(monkeypatch):
    """A new policy is its function and one line in POLICIES: the config accepts its name, the
    scheduler runs it, and HF's greedy tokens still come out."""
    from workbench import policies

    monkeypatch.setitem(policies.POLICIES, "shortest_first", f"{__name__}:shortest_first")
    with pytest.raises(ValueError, match="policy must be one of .*'shortest_first'"):
        Workbench("tiny-qwen3", policy="longest_first")
    wb = Workbench("tiny-qwen3", policy="shortest_first", max_extend_tokens=16)
    ids = [wb.llm.encode(p) for p in (LONG, PROMPTS[0], PROMPTS[1])]
    for p in ids:
        wb.add_request(p, greedy(6))
    records = wb.run(progress=False)
    first = records[0].rows
    assert [r.uid for r in first if r.kind != "decode"][0] == 1  # the shortest prompt first
    outputs = {o["uid"]: o["token_ids"] for o in wb.outputs()}
    assert [outputs[u] for u in range(3)] == hf_greedy("tiny-qwen3", ids, 6)
    wb.check_integrity()
