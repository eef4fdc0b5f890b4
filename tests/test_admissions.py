"""Admission decisions: each refusal reason, and one decision per waiting request per step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench import SamplingParams, Workbench
from workbench.core import PendingReq
from workbench.kvcache.radix import RadixCache
from workbench.kvcache.table import TableManager
from workbench.scheduler.cache import CacheManager
from workbench.scheduler.prefill import PrefillAdder

from .conftest import PROMPTS, greedy


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (dict(max_running_reqs=1), "no_slot"),
        (dict(max_extend_tokens=4), "no_token_budget"),
        (dict(num_pages=40), "kv_full"),
    ],
)
def test_crafted_situations_give_their_reasons(options, reason):
    wb = Workbench("tiny-llama", **options)
    for p in PROMPTS[:3]:
        wb.add_request(p, greedy(12))
    wb.run(progress=False)
    admissions = wb.history.admissions
    assert reason in set(admissions.reason)
    refused = admissions[admissions.reason == reason]
    assert (~refused.admitted).all() and (refused.extend_len == 0).all()


def test_kv_full_after_lock_when_locking_shrinks_what_can_be_evicted():
    """The fourth check: a request fits while its matched prefix counts as evictable, and no
    longer once it is locked."""
    ps = 1
    cache = CacheManager(num_pages=100, page_size=ps, prefix_cache=RadixCache(ps))
    table = TableManager(4, 128, torch.device("cpu"))
    prefix = list(range(1, 41))
    pages = cache.allocate_pages(40)
    cache.release(prefix, 40, pages.astype(np.int32), cache.match(prefix).handle)
    assert cache.free_size == 60 and cache.evictable_size == 40
    pending = PendingReq(0, prefix[:39] + [99, 98], SamplingParams(max_tokens=20))
    # needs 41 + 20 - 39 = 22 tokens; before locking 100 are available, after it 61
    adder = PrefillAdder(token_budget=100, reserved_size=50, cache=cache, table=table)
    assert adder.try_add_one(pending) == "kv_full_after_lock"
    assert cache.evictable_size == 40  # the lock was undone
    adder = PrefillAdder(token_budget=100, reserved_size=30, cache=cache, table=table)
    assert adder.try_add_one(pending).cached_len == 39


def test_every_waiting_request_has_a_decision_at_every_step():
    """The requests behind the first refusal are kept as a slice of the queue, not as decisions;
    the record, the table and the `reject` hook still give each of them its row, in queue order."""
    wb = Workbench("tiny-llama", max_running_reqs=2)
    uids = [wb.add_request(p, greedy(3)) for p in PROMPTS[:6]]
    rejected = []
    wb.hooks.add("reject", lambda e: rejected.append((e.step, e.uid, e.reason)))
    records = wb.run(progress=False)
    first = records[0]
    assert [(a.uid, a.admitted, a.reason) for a in first.admissions] == [
        (uids[0], True, None),
        (uids[1], True, None),
        (uids[2], False, "no_slot"),
        *((uid, False, "queued_behind") for uid in uids[3:]),
    ]
    table = wb.history.admissions
    assert table.groupby("step").size().tolist() == [
        len(r.admissions) for r in records if len(r.admissions)
    ]
    assert sorted(rejected) == sorted(
        (r.step, a.uid, a.reason) for r in records for a in r.admissions if not a.admitted
    )
    # every step a request waited, it has exactly one decision
    waits = table[~table.admitted]
    assert not waits.duplicated(["step", "uid"]).any()
    assert set(waits.reason) == {"no_slot", "queued_behind"}
