"""The cache manager: free pages, the prefix cache over them, and the accounting between them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core import Batch, Req, ceil_page, floor_page
from ..engine.inputs import ranges
from ..kvcache.base import CacheHandle, MatchResult, PrefixCache
from ..kvcache.table import TableManager


class CacheManager:
    """Owns every KV page: each is free, held by the prefix cache, or in use by a request."""

    def __init__(self, num_pages: int, page_size: int, prefix_cache: PrefixCache) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self.total_size = num_pages * page_size  # tokens
        self.prefix_cache = prefix_cache
        self._free = np.arange(num_pages - 1, -1, -1, dtype=np.int32)
        self._free_count = num_pages
        self._is_free = np.ones(num_pages, dtype=bool)  # catches a double free when it happens
        self.on_evict: Callable[[int, int], None] | None = None  # (requested, freed)

    @property
    def evictable_size(self) -> int:
        return self.prefix_cache.evictable_size

    @property
    def free_size(self) -> int:
        return self._free_count * self.page_size

    @property
    def available_size(self) -> int:
        """What a new request may count on: free now, or free once unlocked prefixes are evicted."""
        return self.free_size + self.prefix_cache.evictable_size

    @property
    def in_use_size(self) -> int:
        return self.total_size - self.free_size - self.prefix_cache.size

    @property
    def shares(self) -> bool:
        return self.prefix_cache.shares

    def match(self, token_ids: list[int]) -> MatchResult:
        # NOTE: leave at least one prompt token to compute: its logits give the first output token.
        return self.prefix_cache.match(token_ids[: len(token_ids) - 1])

    def lock(self, handle: CacheHandle) -> None:
        self.prefix_cache.lock(handle)

    def unlock(self, handle: CacheHandle) -> None:
        self.prefix_cache.unlock(handle)

    def allocate_pages(self, count: int) -> np.ndarray:
        if count > self._free_count:
            self.evict((count - self._free_count) * self.page_size)
        if count > self._free_count:
            raise RuntimeError(
                f"KV pool exhausted: need {count} pages, {self._free_count} free "
                "(admission should have prevented this)"
            )
        self._free_count -= count
        # NOTE: reversed, so a fresh pool hands out ascending pages (compact page-table runs).
        pages = self._free[self._free_count : self._free_count + count][::-1].copy()
        self._is_free[pages] = False
        return pages

    def allocate(self, batch: Batch, table: TableManager, previous: Batch | None = None) -> int:
        """Snapshot the batch's ledger and allocate its new tokens' pages; returns their count."""
        batch.snapshot(previous)
        if batch.phase == "decode":
            return self._allocate_decode(batch, table)
        ps, reqs = self.page_size, batch.reqs
        rows, cached, device_len = batch.ledger
        first, end = cached, device_len
        if ps > 1:
            first = -(-cached // ps) * ps
            end = -(-device_len // ps) * ps
        new_slots = end - first
        count = int(new_slots.sum()) // ps
        if count > 0:
            pages = self.allocate_pages(count)
            for i in np.flatnonzero(new_slots).tolist():
                reqs[i].alloc_len = int(end[i])
            slots = (pages[:, None] * ps + np.arange(ps)).reshape(-1)
            table.write_slots(np.repeat(rows, new_slots), ranges(first, end), slots)
        return count

    def _allocate_decode(self, batch: Batch, table: TableManager) -> int:
        ps, reqs = self.page_size, batch.reqs
        rows, cached, _ = batch.ledger
        starting = np.flatnonzero(cached % ps == 0) if ps > 1 else np.arange(len(reqs))
        count = len(starting)
        if count > 0:
            pages = self.allocate_pages(count)
            begins = cached[starting]
            for i, begin in zip(starting.tolist(), begins.tolist()):
                reqs[i].alloc_len = begin + ps
            offsets = np.arange(ps)
            table.write_slots(
                np.repeat(rows[starting], ps),
                (begins[:, None] + offsets).reshape(-1),
                (pages[:, None] * ps + offsets).reshape(-1),
            )
        return count

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` of unlocked cached KV (if there is); returns tokens freed."""
        slots = self.prefix_cache.evict(num_tokens)
        self.free_slots(slots)
        if self.on_evict is not None and len(slots):
            self.on_evict(num_tokens, len(slots))
        return len(slots)

    def free_slots(self, slots: np.ndarray) -> None:
        if len(slots) == 0:
            return
        ps = self.page_size
        assert len(slots) % ps == 0 and np.all(slots[::ps] % ps == 0), "freeing a partial page"
        pages = slots[::ps] // ps
        if self._is_free[pages].any() or len(np.unique(pages)) != len(pages):
            twice = pages[self._is_free[pages]][:8].tolist()
            raise AssertionError(f"KV pages freed twice: {twice}")
        self._is_free[pages] = True
        self._free[self._free_count : self._free_count + len(pages)] = pages[::-1]
        self._free_count += len(pages)

    def release(
        self, token_ids: list[int], kv_len: int, row_slots: np.ndarray, handle: CacheHandle
    ) -> tuple[int, int]:
        """Offer a finished request's full pages to the prefix cache and free the rest."""
        insert_len = floor_page(kv_len, self.page_size)
        kept_len = self.prefix_cache.insert(token_ids[:insert_len], row_slots[:insert_len])
        # NOTE: [0, handle.cached_len) came from the cache itself; what follows up to kept_len
        # duplicates pages the cache already holds, so it is ours to free.
        self.free_slots(row_slots[handle.cached_len : kept_len])
        self.free_slots(row_slots[insert_len:])
        self.unlock(handle)
        return insert_len, kept_len

    def discard(self, row_slots: np.ndarray, handle: CacheHandle) -> None:
        """Free a failed request's pages without caching them (their KV may be incomplete)."""
        self.free_slots(row_slots[handle.cached_len :])
        self.unlock(handle)

    def free_pages_among(self, slots: np.ndarray) -> np.ndarray:
        pages = np.unique(slots // self.page_size)
        return pages[self._is_free[pages]]

    def cache_running(
        self, token_ids: list[int], kv_len: int, row_slots: np.ndarray, handle: CacheHandle
    ) -> tuple[CacheHandle, np.ndarray, int]:
        """Offer a running request's first `kv_len` tokens to the cache; returns its new locked
        handle, the slots now holding them (the caller must point its row there), and the
        tokens the cache already held."""
        insert_len = floor_page(kv_len, self.page_size)
        if insert_len <= handle.cached_len:
            return handle, row_slots[: handle.cached_len], handle.cached_len
        kept_len = self.prefix_cache.insert(token_ids[:insert_len], row_slots[:insert_len])
        match = self.prefix_cache.match(token_ids[:insert_len])
        assert match.handle.cached_len == insert_len, "an inserted prefix must match in full"
        self.free_slots(row_slots[handle.cached_len : kept_len])
        self.lock(match.handle)
        self.unlock(handle)
        return match.handle, match.slots, kept_len

    def share_prompt(self, req: Req, table: TableManager) -> tuple[int, int]:
        """Share a running request's computed prompt pages; returns (tokens now cached, tokens
        cached before), or (0, 0) when it added none."""
        row = table.page_table_host[req.table_idx]
        before = req.cache_handle.cached_len
        computed = row[: ceil_page(req.cached_len, self.page_size)].copy()
        handle, slots, kept = self.cache_running(
            req.token_ids, req.cached_len, computed, req.cache_handle
        )
        req.cache_handle = handle
        changed = np.flatnonzero(row[: len(slots)] != slots)
        if len(changed):
            lo, hi = int(changed[0]), int(changed[-1]) + 1
            table.write_row(req.table_idx, lo, slots[lo:hi])
        return (handle.cached_len, kept) if handle.cached_len > before else (0, 0)

    def free_req(self, req: Req, table: TableManager) -> tuple[int, int]:
        """Give back a request's slot and pages (full pages to the prefix cache unless it
        failed); returns what `release` does where the cache shares, else (0, 0)."""
        assert not req.released, f"request {req.uid} released twice"
        req.released = True
        row_slots = table.page_table_host[req.table_idx, : req.alloc_len].copy()
        if req.finish_reason == "error":
            self.discard(row_slots, req.cache_handle)
            inserted = kept = 0
        else:
            inserted, kept = self.release(
                req.token_ids, req.cached_len, row_slots, req.cache_handle
            )
        table.free(req.table_idx)
        return (inserted, kept) if self.shares else (0, 0)

    def check_integrity(self, in_use_slots: np.ndarray | None = None) -> None:
        """Every page is exactly one of free, cached or in use; nothing leaked or freed twice."""
        ps = self.page_size
        free = self._free[: self._free_count]
        cached = self.prefix_cache.slots()
        used = np.zeros(0, np.int32) if in_use_slots is None else in_use_slots
        assert len(cached) % ps == 0 and len(used) % ps == 0
        pages = np.concatenate([free, cached[::ps] // ps, used[::ps] // ps])
        counts = np.bincount(pages, minlength=self.num_pages)
        if len(counts) > self.num_pages or np.any(counts != 1):
            twice = np.flatnonzero(counts > 1)[:8].tolist()
            lost = np.flatnonzero(counts == 0)[:8].tolist()
            raise AssertionError(
                f"KV pool integrity: {self.num_pages} pages, {len(free)} free + "
                f"{len(cached) // ps} cached + {len(used) // ps} in use; "
                f"owned twice: {twice}; owned by nobody (leaked): {lost}"
            )
