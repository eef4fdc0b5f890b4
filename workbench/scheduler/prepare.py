"""Preparing a batch: allocate KV pages for its new tokens, then build its device inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core import Batch, ChunkedReq
from ..engine.transfer import to_device_many
from .cache import ceil_page

if TYPE_CHECKING:
    from .scheduler import Scheduler


def prepare_batch(sched: Scheduler, batch: Batch) -> int:
    """Fill `batch.positions`, `input_ids`, `out_loc`, `sample_idx` and the attention metadata;
    returns the number of KV pages allocated."""
    ps, reqs, device, table = sched.page_size, batch.reqs, sched.engine.device, sched.table
    first = np.array([ceil_page(r.cached_len, ps) for r in reqs])  # allocated before this batch
    end = np.array([ceil_page(r.device_len, ps) for r in reqs])
    new_pages = (end - first) // ps
    count = int(new_pages.sum())
    if count > 0:
        pages = sched.cache.allocate_pages(count)
        slots = (pages[:, None] * ps + np.arange(ps)).reshape(-1)
        rows = np.repeat([r.table_idx for r in reqs], new_pages * ps)
        cols = np.concatenate([np.arange(a, b) for a, b in zip(first, end)])
        table.write_slots(rows, cols, slots)

    extend = np.array([r.extend_len for r in reqs])
    positions = np.concatenate([np.arange(r.cached_len, r.device_len) for r in reqs])
    token_rows = np.repeat([r.table_idx for r in reqs], extend)
    out_loc = table.page_table_host[token_rows, positions]
    sampled = np.array([not isinstance(r, ChunkedReq) for r in reqs], dtype=bool)
    sample_idx = (np.cumsum(extend) - 1)[sampled]

    rows_t, positions_t, out_loc_t, sample_idx_t = to_device_many(
        [token_rows, positions, out_loc, sample_idx], device
    )
    batch.positions = positions_t
    batch.input_ids = table.token_pool[rows_t, positions_t]
    batch.out_loc = out_loc_t
    batch.sample_idx = sample_idx_t
    sched.engine.prepare(batch)
    return count
