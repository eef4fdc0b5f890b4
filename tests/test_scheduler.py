"""The scheduler's promises: exact token budgets, each prompt token computed once, continuous
batching, admission that waits instead of failing, and a clean pool after every run."""

from __future__ import annotations

from collections import defaultdict

import pytest

from workbench import LLM, SamplingParams

from .conftest import PROMPTS, greedy, hf_greedy, run


def prefill_rows(steps):
    return [(s.step, r) for s in steps if s.phase != "decode" for r in s.rows]


@pytest.mark.parametrize("budget", [1, 6, 16])
def test_prefill_batches_use_exactly_their_budget(budget):
    llm = LLM("tiny-llama", max_extend_tokens=budget, max_running_reqs=8)
    ids = [llm.encode(p) for p in PROMPTS]
    _, steps = run(llm, ids, greedy(4))
    sizes = [sum(r.extend_len for r in s.rows) for s in steps if s.phase != "decode"]
    assert all(size == budget for size in sizes[:-1]), sizes
    assert 0 < sizes[-1] <= budget
    assert sum(sizes) == sum(len(i) for i in ids)


def test_every_prompt_token_is_computed_exactly_once():
    llm = LLM("tiny-llama", max_extend_tokens=7, page_size=4, max_running_reqs=8)
    ids = [llm.encode(p) for p in PROMPTS]
    outputs, steps = run(llm, ids, greedy(3))
    spans = defaultdict(list)
    for _, row in prefill_rows(steps):
        spans[row.uid].append((row.cached_len - row.extend_len, row.cached_len))  # computed
    for out, prompt in zip(outputs, ids):
        ranges = sorted(spans[out["uid"]])
        assert ranges[0][0] == 0 and ranges[-1][1] == len(prompt)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), ranges
        # only the last piece is a full prefill (sampled); the others are chunks
        kinds = [r.kind for _, r in prefill_rows(steps) if r.uid == out["uid"]]
        assert kinds[-1] == "prefill" and set(kinds[:-1]) <= {"chunk"}


def test_requests_join_and_leave_the_running_set():
    """Different max_tokens and fewer slots than requests: requests are admitted as others
    finish (continuous batching), and outputs come back in input order."""
    llm = LLM("tiny-llama", max_running_reqs=3)
    max_tokens = [2, 9, 4, 6, 1, 5]
    prompts = [llm.encode(PROMPTS[i % len(PROMPTS)]) for i in range(len(max_tokens))]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in max_tokens]
    outputs, steps = run(llm, prompts, params)
    assert [o["completion_tokens"] for o in outputs] == max_tokens
    assert [o["uid"] for o in outputs] == sorted(o["uid"] for o in outputs)
    for out, prompt, n in zip(outputs, prompts, max_tokens):
        assert out["token_ids"] == hf_greedy("tiny-llama", [prompt], n)[0]
    running = [{r.uid for r in s.rows} for s in steps if s.phase == "decode"]
    assert max(len(r) for r in running) == 3
    # a request admitted later decodes beside one admitted at the start
    first_uid = outputs[1]["uid"]
    assert any(first_uid in r and (r - {0, 1, 2}) for r in running)
    # the running set never holds a finished request
    finished_at = {}
    for s in steps:
        for uid in s.finished:
            finished_at[uid] = s.step
    for s in steps:
        for r in s.rows:
            assert s.step <= finished_at[r.uid]


def test_waiting_for_slots_gives_the_no_slot_reason():
    llm = LLM("tiny-llama", max_running_reqs=1)
    _, steps = run(llm, [llm.encode(p) for p in PROMPTS[:3]], greedy(2))
    reasons = {a.reason for s in steps for a in s.admissions if not a.admitted}
    assert "no_slot" in reasons and "queued_behind" in reasons


@pytest.mark.parametrize("page_size", [1, 4])
def test_small_kv_pool_waits_and_still_matches_hf(page_size):
    """A pool that fits one request at a time: admission waits (kv_full), nothing fails."""
    prompts_len_max = 40
    max_new = 8
    num_pages = -(-(prompts_len_max + max_new) // page_size) + 1
    llm = LLM("tiny-qwen3", page_size=page_size, num_pages=num_pages, max_running_reqs=8)
    ids = [llm.encode(p) for p in PROMPTS]
    assert max(len(i) for i in ids) <= prompts_len_max
    outputs, steps = run(llm, ids, greedy(max_new))
    assert [o["token_ids"] for o in outputs] == hf_greedy("tiny-qwen3", ids, max_new)
    reasons = {a.reason for s in steps for a in s.admissions if not a.admitted}
    assert "kv_full" in reasons
    assert max(len(s.rows) for s in steps if s.phase == "decode") < len(PROMPTS)


def test_integrity_check_catches_a_leak_and_a_double_free(tiny_llm):
    cache = tiny_llm.scheduler.cache
    pages = cache.allocate_pages(2)
    with pytest.raises(AssertionError, match="leaked"):
        tiny_llm.check_integrity()
    slots = (pages * cache.page_size).astype("int32")  # page_size 1
    cache.free_slots(slots)
    tiny_llm.check_integrity()
    with pytest.raises(AssertionError, match="freed twice"):
        cache.free_slots(slots[:1])
    tiny_llm.check_integrity()  # the refused free changed nothing


@pytest.mark.parametrize("overlap", [False, True])
def test_each_batch_launches_with_its_requests_own_lengths(overlap, monkeypatch):
    """A decode batch after one of the same requests takes its ledger from that batch's
    (`Batch.snapshot(after)`): at every launch it equals a fresh read of the requests, through
    joins, ends at different lengths and an abort."""
    from workbench.core import Batch

    llm = LLM("tiny-llama", max_extend_tokens=16, max_running_reqs=8, overlap=overlap)
    snapshot, seen = Batch.snapshot, []

    def checked(batch, after=None):
        snapshot(batch, after)
        fresh = Batch(batch.reqs, batch.phase, batch.num_decode)
        snapshot(fresh)
        assert (batch.ledger == fresh.ledger).all() and (batch.max_lens == fresh.max_lens).all()
        seen.append(after is not None and after.reqs == batch.reqs and batch.phase == "decode")

    monkeypatch.setattr(Batch, "snapshot", checked)
    ids = [llm.encode(p) for p in PROMPTS]
    uids = llm.add_requests(ids, [SamplingParams(max_tokens=3 + 2 * k) for k in range(len(ids))])
    for _ in range(6):
        llm.scheduler.step()
    llm.scheduler.abort(uids[-1])
    while llm.scheduler.step() is not None:
        pass
    llm.check_integrity()
    assert any(seen) and not all(seen)  # both ways were taken


def test_eos_ids_set_on_a_built_scheduler_end_requests():
    """`scheduler.eos_ids` is read at every collect: a token made EOS after the scheduler was
    built ends the requests that emit it."""

    llm = LLM("tiny-qwen3")
    prompt = [5, 6, 7, 8, 9]
    probe = llm.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True))[0]["token_ids"]
    eos = probe[3]
    llm.scheduler.eos_ids = {eos}
    out = llm.generate([prompt], SamplingParams(max_tokens=8))[0]
    assert out["token_ids"] == probe[: probe.index(eos) + 1]
    assert out["finish_reason"] == "stop"
    llm.check_integrity()
