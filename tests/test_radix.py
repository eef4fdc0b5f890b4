"""The radix prefix cache: sharing, page alignment, LRU eviction, locks, and the scheduler's
use of it under memory pressure."""

from __future__ import annotations

import heapq
import random

import numpy as np
import pytest

from workbench import LLM
from workbench.kvcache.radix import RadixCache
from workbench.scheduler.cache import CacheManager

from .conftest import PROMPTS, greedy, hf_greedy, run


def slots(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


# -- the tree on its own ---------------------------------------------------------------------
def test_match_splits_and_returns_the_slots_of_the_longest_prefix():
    tree = RadixCache(page_size=1)
    assert tree.insert([1, 2, 3, 4, 5], slots(100, 5)) == 0
    assert tree.insert([1, 2, 3, 9], slots(200, 4)) == 3  # three tokens already held
    m = tree.match([1, 2, 3, 9, 7])
    assert m.handle.cached_len == 4
    assert m.slots.tolist() == [100, 101, 102, 203]
    assert tree.match([1, 2, 7]).slots.tolist() == [100, 101]
    assert tree.size == 6 and tree.evictable_size == 6
    tree.check_invariants()


def test_page_aligned_matches_and_inserts():
    tree = RadixCache(page_size=4)
    tree.insert(list(range(12)), slots(0, 12))
    # 7 tokens agree, but only whole pages count
    m = tree.match([0, 1, 2, 3, 4, 5, 6, 99, 8, 9, 10, 11])
    assert m.handle.cached_len == 4 and m.slots.tolist() == [0, 1, 2, 3]
    # a run shorter than a page never matches
    assert tree.match([0, 1, 2]).handle.cached_len == 0
    assert tree.insert([0, 1, 2, 3, 4, 5, 6, 99], slots(40, 8)) == 4
    for node in tree._nodes():
        assert len(node.key) % 4 == 0
    tree.check_invariants()


def test_eviction_is_least_recently_used_and_spares_locked_paths():
    tree = RadixCache(page_size=1)
    tree.insert([1, 1, 1], slots(0, 3))  # a
    tree.insert([2, 2, 2], slots(10, 3))  # b
    tree.insert([3, 3, 3], slots(20, 3))  # c
    tree.match([1, 1, 1])  # a is now the most recently used
    locked = tree.match([3, 3, 3]).handle
    tree.lock(locked)
    assert tree.evictable_size == 6 and tree.protected_size == 3
    assert tree.evict(1).tolist() == [12]  # the tail of b: least recently used, unlocked
    assert tree.match([2, 2, 2]).handle.cached_len == 2  # b's head stays cached
    tree.match([1, 1, 1])
    assert tree.evict(2).tolist() == [10, 11]  # what is left of b, before a
    assert tree.evict(100).tolist() == [0, 1, 2]  # a; c is locked
    assert tree.match([3, 3, 3]).handle.cached_len == 3
    tree.unlock(locked)
    assert tree.evict(100).tolist() == [20, 21, 22]
    assert tree.size == 0
    tree.check_invariants()


def test_a_parent_is_evicted_only_after_its_children():
    tree = RadixCache(page_size=1)
    tree.insert([1, 2, 3], slots(0, 3))
    tree.insert([1, 2, 4], slots(10, 3))  # splits [1, 2] off as a parent
    freed = tree.evict(1)
    assert len(freed) == 1 and freed[0] in (2, 12)
    assert tree.match([1, 2]).handle.cached_len == 2
    tree.check_invariants()


class FullScan(RadixCache):
    """Eviction as it was before the heap of leaves: the unlocked leaves gathered from the whole
    tree at every call."""

    def evict(self, num_tokens: int) -> np.ndarray:
        heap = [(n.last_access, id(n), n) for n in self._nodes() if n.is_leaf and n.ref_count == 0]
        heapq.heapify(heap)
        freed, count = [], 0
        while heap and count < num_tokens:
            _, _, node = heapq.heappop(heap)
            need = -(-(num_tokens - count) // self.page_size) * self.page_size
            if len(node.key) > need:
                self._split(node, len(node.key) - need)
            parent = node.parent
            del parent.children[self._child_key(node.key)]
            freed.append(node.value)
            count += len(node.value)
            self.evictable_size -= len(node.key)
            if parent is not self.root and parent.is_leaf and parent.ref_count == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return np.concatenate(freed) if freed else np.zeros(0, dtype=np.int32)


@pytest.mark.parametrize("page_size", [1, 4])
def test_eviction_takes_the_same_leaves_as_a_scan_of_the_whole_tree(page_size):
    rng = random.Random(page_size)
    trees = RadixCache(page_size), FullScan(page_size)
    stems = [[rng.randrange(4) for _ in range(8 * page_size)] for _ in range(6)]
    held: list[tuple] = []  # a locked handle in each tree
    next_slot, evicted = 0, 0
    for i in range(3000):
        ids = rng.choice(stems)[: rng.randint(1, 8) * page_size]
        ids += [rng.randrange(4) for _ in range(rng.randint(0, 4) * page_size)]
        op = rng.random()
        if op < 0.35:
            for tree in trees:
                tree.insert(ids, slots(next_slot, len(ids)))
            next_slot += len(ids)
        elif op < 0.6:
            handles = tuple(tree.match(ids).handle for tree in trees)
            if rng.random() < 0.5:
                for tree, handle in zip(trees, handles):
                    tree.lock(handle)
                held.append(handles)
        elif op < 0.75 and held:
            for tree, handle in zip(trees, held.pop(rng.randrange(len(held)))):
                tree.unlock(handle)
        else:
            n = rng.randint(1, 6) * page_size
            freed = [tree.evict(n).tolist() for tree in trees]
            assert freed[0] == freed[1], f"operation {i}"
            evicted += len(freed[0])
        if i % 100 == 0:
            trees[0].check_invariants()
    assert evicted > 1000
    assert sorted(trees[0].slots().tolist()) == sorted(trees[1].slots().tolist())


def test_evicted_slots_are_reused_by_the_next_allocation():
    manager = CacheManager(num_pages=4, page_size=2, prefix_cache=RadixCache(2))
    pages = manager.allocate_pages(4)
    row = (pages[:, None] * 2 + np.arange(2)).reshape(-1)
    manager.release(list(range(8)), 8, row, manager.match(list(range(9))).handle)
    assert manager.free_size == 0 and manager.evictable_size == 8
    again = manager.allocate_pages(3)
    assert set(again.tolist()) <= set(pages.tolist())
    assert manager.evictable_size == 2  # only what was needed, in whole pages: 3 of 4 evicted
    assert manager.match(list(range(9))).handle.cached_len == 2
    manager.check_integrity(
        np.concatenate([(again[:, None] * 2 + np.arange(2)).reshape(-1)]).astype(np.int32)
    )


# -- through the engine ----------------------------------------------------------------------
def test_second_run_computes_one_token_per_prompt():
    llm = LLM("tiny-llama", max_running_reqs=8)
    ids = [llm.encode(p) for p in PROMPTS]
    first, _ = run(llm, ids, greedy(6))
    second, steps = run(llm, ids, greedy(6))
    assert [o["token_ids"] for o in first] == [o["token_ids"] for o in second]
    assert all(o["cached_tokens"] == 0 for o in first)
    assert [o["cached_tokens"] for o in second] == [o["prompt_tokens"] - 1 for o in second]
    computed = sum(r.extend_len for s in steps if s.phase != "decode" for r in s.rows)
    assert computed == len(ids)


def test_page_size_four_hits_whole_pages():
    llm = LLM("tiny-llama", page_size=4, max_running_reqs=8)
    ids = [llm.encode(p) for p in PROMPTS]
    run(llm, ids, greedy(5))
    second, _ = run(llm, ids, greedy(5))
    for o in second:
        assert o["cached_tokens"] == (o["prompt_tokens"] - 1) // 4 * 4


def shared_prefix_workload(n: int, prefix_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(100, 20000) for _ in range(prefix_len)]
    # suffixes start with distinct tokens, so requests share exactly the prefix
    return [
        prefix + [20000 + i] + [rng.randrange(100, 20000) for _ in range(rng.randrange(5, 30))]
        for i in range(n)
    ]


def test_a_shared_prefix_submitted_together_is_computed_once():
    """Our guarantee: a request that shares >= share_threshold uncached tokens with a request
    already in the batch waits (wait_for_prefix) until that request's prefix is cached. So 16
    requests sharing a 200-token prefix compute it exactly once, even when submitted together."""
    llm = LLM("tiny-qwen3", max_running_reqs=32)
    prompts = shared_prefix_workload(16, 200)
    outputs, steps = run(llm, prompts, greedy(4))
    prefix_computed = sum(
        max(0, min(r.cached_len, 200) - (r.cached_len - r.extend_len))  # what it computed
        for s in steps
        if s.phase != "decode"
        for r in s.rows
    )
    assert prefix_computed == 200
    assert sorted(o["cached_tokens"] for o in outputs) == [0] + [200] * 15
    reasons = [a.reason for s in steps for a in s.admissions]
    assert reasons.count("wait_for_prefix") == 15
    assert [o["token_ids"] for o in outputs] == hf_greedy("tiny-qwen3", prompts, 4)


@pytest.mark.parametrize(
    ("threshold", "prefix_len", "waits"), [(4, 3, 0), (4, 6, 7), (32, 31, 0), (32, 40, 7)]
)
def test_a_request_waits_exactly_when_it_shares_the_threshold(threshold, prefix_len, waits):
    """The rule at its edge, for thresholds below and above the 16 first tokens admission
    groups prompts by: 8 prompts submitted together sharing `prefix_len` tokens."""
    llm = LLM("tiny-llama", max_running_reqs=16, share_threshold=threshold)
    _, steps = run(llm, shared_prefix_workload(8, prefix_len), greedy(2))
    reasons = [a.reason for s in steps for a in s.admissions]
    assert reasons.count("wait_for_prefix") == waits


def test_without_waiting_one_batch_computes_the_prefix_for_everyone():
    """The other side of the guarantee: requests admitted into the same batch cannot share
    what none of them has computed yet."""
    llm = LLM("tiny-qwen3", max_running_reqs=32, share_threshold=0)
    prompts = shared_prefix_workload(16, 200)
    outputs, steps = run(llm, prompts, greedy(4))
    assert len([s for s in steps if s.phase != "decode"]) == 1
    assert all(o["cached_tokens"] == 0 for o in outputs)


def test_duplicate_prefix_does_not_leave_a_row_pointing_at_freed_pages():
    """Two identical prompts in one batch both compute their KV; the second insert finds the
    pages already cached. Its page-table row must be moved to the cached pages before its own
    copies are freed, or decode reads freed (and soon reused) slots."""
    prompt = shared_prefix_workload(1, 60)[0]
    others = shared_prefix_workload(6, 40, seed=1)
    # a tight pool: freed pages get reused by the next admissions right away
    llm = LLM("tiny-llama", num_pages=200, max_running_reqs=8, share_threshold=0)
    params = [greedy(24), greedy(24)] + [greedy(8)] * len(others)
    checked = []

    def check(record):
        llm.check_integrity()  # includes: no live row points at a free page
        checked.append(record.step)

    llm.generate([prompt, prompt, *others], params, on_step=check)
    outputs = llm.generate([prompt], greedy(24))
    llm.check_integrity()
    assert len(checked) > 10
    ref = hf_greedy("tiny-llama", [prompt], 24)[0]
    assert outputs[0]["token_ids"] == ref


@pytest.mark.parametrize("page_size", [1, 4])
def test_tiny_pool_with_heavy_sharing_matches_hf(page_size):
    prompts = shared_prefix_workload(10, 150, seed=3)
    longest = max(len(p) for p in prompts) + 6
    num_pages = -(-longest // page_size) + 40 // page_size  # one request, and a little
    llm = LLM("tiny-llama", page_size=page_size, num_pages=num_pages, max_running_reqs=8)
    for _ in range(2):
        outputs, steps = run(llm, prompts, greedy(6))
        assert [o["token_ids"] for o in outputs] == hf_greedy("tiny-llama", prompts, 6)
    assert any(o["cached_tokens"] > 0 for o in outputs)
