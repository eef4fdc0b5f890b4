"""Aborting a request wherever it is: waiting, due later, part-way through its prompt, decoding,
or with a batch in flight that still computes for it (overlap). Nothing leaks, nothing is freed
twice or while a batch still writes to it, and every other request still gets HF's tokens."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench import SamplingParams, Workbench

from .conftest import PROMPTS, greedy, hf_greedy

LONG = PROMPTS[3] * 3  # about 75 tokens: chunked under a budget of 16


def _state(wb: Workbench, uid: int) -> str:
    s = wb.scheduler
    for p in s.prefill.queue:
        if p.uid == uid:
            return "chunked" if p.chunked is not None else "waiting"
    if any(r.uid == uid for r in s.decode.running):
        return "running"
    return "finished" if uid in s.finished else "elsewhere"


@pytest.mark.parametrize("cache", ["naive", "radix"])
@pytest.mark.parametrize("overlap", [False, True])
def test_abort_anywhere_and_the_others_still_match_hf(overlap, cache):
    wb = Workbench(
        "tiny-llama", max_extend_tokens=16, max_running_reqs=3, overlap=overlap, cache=cache
    )
    prompts = [LONG, PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[4], LONG + " and"]
    ids = [wb.llm.encode(p) for p in prompts]
    uids = [wb.add_request(p, greedy(12)) for p in ids[:5]]
    late = wb.add_request(ids[5], greedy(12), arrival_step=50)
    long_uid, running_uid, waiting_uid = uids[0], uids[1], uids[4]

    wb.step()  # the long prompt takes the whole budget: its first chunk
    assert _state(wb, long_uid) == "chunked" and _state(wb, waiting_uid) == "waiting"
    out = wb.abort(long_uid)
    assert out["finish_reason"] == "abort" and out["completion_tokens"] == 0
    wb.abort(waiting_uid)
    wb.abort(late)

    while _state(wb, running_uid) != "running":
        wb.step()
    wb.step(3)
    assert _state(wb, running_uid) == "running"
    if overlap:  # its next token is being computed: its pages stay taken until that batch is done
        assert any(r.uid == running_uid for r in wb.scheduler.in_flight.batch.reqs)
    partial = wb.abort(running_uid)
    assert 0 < partial["completion_tokens"] < 12

    wb.run(progress=False)
    wb.check_integrity()
    outputs = {o["uid"]: o for o in wb.outputs()}
    assert set(outputs) == {*uids, late}
    kept = [uids[2], uids[3]]
    expected = hf_greedy("tiny-llama", [ids[2], ids[3]], 12)
    assert [outputs[u]["token_ids"] for u in kept] == expected
    assert all(outputs[u]["finish_reason"] == "length" for u in kept)
    # the aborted running request got a prefix of what it would have got
    full = hf_greedy("tiny-llama", [ids[1]], 12)[0]
    assert full[: len(partial["token_ids"])] == partial["token_ids"]
    requests = wb.history.requests.set_index("uid")
    aborted = [long_uid, waiting_uid, late, running_uid]
    assert list(requests.loc[aborted, "finish_reason"]) == ["abort"] * 4
    assert pd.isna(requests.loc[waiting_uid, "first_scheduled_step"])  # never ran


def test_abort_refuses_what_is_not_there():
    wb = Workbench("tiny-llama")
    uid = wb.add_request(PROMPTS[0], SamplingParams(max_tokens=2))
    wb.run(progress=False)
    with pytest.raises(ValueError, match="already finished"):
        wb.abort(uid)
    with pytest.raises(ValueError, match="no request 99"):
        wb.abort(99)
    other = wb.add_request(PROMPTS[1], SamplingParams(max_tokens=2))
    wb.abort(other)
    with pytest.raises(ValueError, match="already finished \\(abort\\)"):
        wb.abort(other)
    wb.check_integrity()


def test_abort_fires_request_finish_with_its_reason():
    wb = Workbench("tiny-llama")
    seen = []
    wb.hooks.add("request.finish", lambda e: seen.append((e.uid, e.reason)))
    a = wb.add_request(PROMPTS[0], greedy(4))
    b = wb.add_request(PROMPTS[1], greedy(4))
    wb.step(2)
    wb.abort(b)
    wb.run(progress=False)
    assert seen == [(b, "abort"), (a, "length")]
