"""The integrity check: the KV pool's accounting and the live requests' rows agree."""

from __future__ import annotations

import numpy as np

from ..core import Req, ceil_page
from ..kvcache.table import TableManager
from .cache import CacheManager


def check_integrity(cache: CacheManager, table: TableManager, live: list[Req]) -> None:
    """Every KV page and request slot is free, cached, or held by exactly one live request."""
    ps, rows = cache.page_size, table.page_table_host
    for r in live:
        assert r.alloc_len == ceil_page(r.cached_len, ps), (
            f"request {r.uid} holds KV slots up to {r.alloc_len}, but {r.cached_len} are computed"
        )
        assert not r.released, f"request {r.uid} is live but was released"
    used = [rows[r.table_idx, r.cache_handle.cached_len : r.alloc_len] for r in live]
    cache.check_integrity(np.concatenate(used) if used else None)
    for r in live:
        stale = cache.free_pages_among(rows[r.table_idx, : ceil_page(r.cached_len, ps)])
        assert not len(stale), f"request {r.uid}'s page table points at free pages {stale[:8]}"
    slots = {r.table_idx for r in live}
    assert len(slots) == len(live), "two live requests share a request slot"
    assert table.available_size + len(slots) == table.max_running_reqs, (
        f"request slots: {table.available_size} free + {len(slots)} live "
        f"!= {table.max_running_reqs}"
    )
