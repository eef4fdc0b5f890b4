"""A prepared batch's device inputs, read from the request table: each new token's position,
input id (from the token pool) and KV slot, and the rows that get logits."""

from __future__ import annotations

import numpy as np

from ..core import Batch
from ..device import to_device_many
from ..kvcache.table import TableManager


def fill_inputs(batch: Batch, table: TableManager) -> None:
    """Fill `batch.positions`, `input_ids`, `out_loc` and `sample_idx` from its ledger
    (`Batch.snapshot`), for requests whose new tokens' KV slots are in the page table already
    (the engine adds the attention metadata)."""
    rows, cached, device_len = batch.ledger
    extend = device_len - cached
    positions = ranges(cached, device_len)
    token_rows = np.repeat(rows, extend)
    out_loc = table.page_table_host[token_rows, positions]
    sample_idx = (np.cumsum(extend) - 1)[batch.sampled_mask()]

    rows_t, positions_t, out_loc_t, sample_idx_t = to_device_many(
        [token_rows, positions, out_loc, sample_idx], table.device
    )
    batch.positions = positions_t
    batch.input_ids = table.token_pool[rows_t, positions_t]
    batch.out_loc = out_loc_t
    batch.sample_idx = sample_idx_t


def ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, b) for a, b in zip(starts, ends)])`` in whole-array steps."""
    lens = ends - starts
    before = np.cumsum(lens) - lens  # where each range begins in the output
    return np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - before, lens)
