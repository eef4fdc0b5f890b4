"""Property test: random sequences of request starts, mid-run inserts, finishes, allocations and
evictions keep the radix tree's invariants and the pool's accounting."""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from workbench.core import ceil_page
from workbench.kvcache.radix import RadixCache
from workbench.scheduler.cache import CacheManager

PROMPT = st.lists(st.integers(0, 3), min_size=1, max_size=24)  # a tiny alphabet: lots of sharing


class RadixMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size):
        self.ps = page_size
        self.tree = RadixCache(page_size)
        self.manager = CacheManager(
            num_pages=48 // page_size, page_size=page_size, prefix_cache=self.tree
        )
        self.reqs: list[dict] = []  # token_ids, handle, row (slots of its tokens), kv_len

    @rule(prompt=PROMPT)
    def start_request(self, prompt):
        match = self.manager.match(prompt)
        cached = match.handle.cached_len
        need = ceil_page(len(prompt), self.ps) - cached
        if need > self.manager.available_size:
            return  # admission would refuse it
        self.manager.lock(match.handle)
        if need > self.manager.available_size:
            self.manager.unlock(match.handle)
            return
        pages = self.manager.allocate_pages(need // self.ps)
        own = (pages[:, None] * self.ps + np.arange(self.ps)).reshape(-1).astype(np.int32)
        row = np.concatenate([match.slots, own])
        self.reqs.append(
            dict(token_ids=list(prompt), handle=match.handle, row=row, kv_len=len(prompt))
        )

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def share_running_prefix(self, data):
        req = data.draw(st.sampled_from(self.reqs))
        handle, slots, _ = self.manager.cache_running(
            req["token_ids"], req["kv_len"], req["row"].copy(), req["handle"]
        )
        req["handle"] = handle
        req["row"][: len(slots)] = slots  # what the scheduler does to the page-table row

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish_request(self, data):
        req = self.reqs.pop(data.draw(st.integers(0, len(self.reqs) - 1)))
        self.manager.release(req["token_ids"], req["kv_len"], req["row"], req["handle"])

    @rule(count=st.integers(1, 12))
    def allocate_then_free(self, count):
        if count * self.ps > self.manager.available_size:
            return
        pages = self.manager.allocate_pages(count)
        self.manager.free_slots(
            (pages[:, None] * self.ps + np.arange(self.ps)).reshape(-1).astype(np.int32)
        )

    @rule()
    def allocate_everything_then_free(self):
        """Takes every free and evictable page: evicts all unlocked KV, and nothing locked."""
        count = self.manager.available_size // self.ps
        if count:
            pages = self.manager.allocate_pages(count)
            assert self.tree.evictable_size == 0
            self.manager.free_slots(
                (pages[:, None] * self.ps + np.arange(self.ps)).reshape(-1).astype(np.int32)
            )

    @rule(count=st.integers(1, 64))
    def evict(self, count):
        evictable, protected = self.tree.evictable_size, self.tree.protected_size
        freed = self.manager.evict(count)
        assert freed == min(evictable, ceil_page(count, self.ps))  # whole pages, no more
        assert self.tree.protected_size == protected  # nothing locked was touched

    @rule(prompt=PROMPT)
    def match_touches_only_lru_order(self, prompt):
        before = (self.tree.size, self.tree.evictable_size)
        m = self.tree.match(prompt)
        assert m.handle.cached_len % self.ps == 0 and len(m.slots) == m.handle.cached_len
        assert (self.tree.size, self.tree.evictable_size) == before

    @invariant()
    def tree_and_pool_agree(self):
        if not hasattr(self, "tree"):
            return
        self.tree.check_invariants()
        used = [
            r["row"][r["handle"].cached_len : ceil_page(r["kv_len"], self.ps)] for r in self.reqs
        ]
        self.manager.check_integrity(np.concatenate(used) if used else None)
        for r in self.reqs:
            assert not len(self.manager.free_pages_among(r["row"]))
            # the cached part of a request's row is exactly what the tree holds for its tokens
            prefix = r["token_ids"][: r["handle"].cached_len]
            assert self.tree.match(prefix).slots.tolist() == r["row"][: len(prefix)].tolist()
        assert (
            self.manager.free_size + self.tree.size + self.manager.in_use_size
            == self.manager.total_size
        )


RadixMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRadixProperties = RadixMachine.TestCase
