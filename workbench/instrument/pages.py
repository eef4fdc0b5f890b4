"""Page-table rows as runs of consecutive KV slots (record="full"): what each row gained in a
step (`PageSnapshots`, read from the request table as the batch is prepared; the history's
`pages_at` puts a step's rows back together from those gains)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..core import ReqView
    from ..kvcache.table import TableManager


def slot_runs(
    page_table: np.ndarray, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> list[list[tuple[int, int, int]]]:
    """For each row `idx[i]`, its entries ``[starts[i], ends[i])`` as maximal runs of consecutive
    KV slots, ``(pos_start, pos_end, slot_start)``, in whole-array steps."""
    lens = ends - starts
    first = np.cumsum(lens) - lens  # where each segment begins in the flat arrays
    pos = np.arange(int(lens.sum())) - np.repeat(first - starts, lens)
    slots = page_table[np.repeat(idx, lens), pos].astype(np.int64)
    begins = np.ones(len(slots), dtype=bool)
    begins[1:] = slots[1:] != slots[:-1] + 1
    begins[first[lens > 0]] = True
    run_starts = np.flatnonzero(begins)
    run_ends = np.append(run_starts[1:], len(slots))
    owner = np.repeat(np.arange(len(idx)), lens)[run_starts]
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(len(idx))]
    for o, a, b, p, slot in zip(
        owner.tolist(),
        run_starts.tolist(),
        run_ends.tolist(),
        pos[run_starts].tolist(),
        slots[run_starts].tolist(),
    ):
        out[o].append((p, p + b - a, slot))
    return out


class PageSnapshots:
    """The page-table rows of each batch as slot runs (record="full"), each step only what a
    row gained since the last: a decode step of 256 requests reads and keeps 256 entries, not
    the hundreds of thousands its rows hold (`pages_at` puts a step's rows back together).
    With one-token pages, requests decoding side by side take interleaved slots, so a row is
    one run per token: keeping every row whole at every step grows with steps x rows x length.
    """

    def __init__(self) -> None:
        # row -> uid, rewrites, length and since when (step) its runs are listed
        self._rows: dict[int, tuple[int, int, int, int]] = {}

    def take(self, table: TableManager, rows: list[ReqView], step: int) -> dict[int, tuple]:
        """Row -> (since, runs gained): `since` is the step from which the row's runs are
        listed (this one when the row is new, changed hands or was rewritten), the runs
        (pos_start, pos_end, slot_start) its positions gained since it was last taken."""
        begins, sinces = [], []
        for r in rows:
            kept = self._rows.get(r.table_idx)
            rewrites = int(table.rewrites[r.table_idx])
            if kept is None or kept[:2] != (r.uid, rewrites) or kept[2] > r.device_len:
                kept = (r.uid, rewrites, 0, step)
            begins.append(kept[2])
            sinces.append(kept[3])
            self._rows[r.table_idx] = (r.uid, rewrites, r.device_len, kept[3])
        idx = np.array([r.table_idx for r in rows], dtype=np.int64)
        ends = np.array([r.device_len for r in rows], dtype=np.int64)
        gained = slot_runs(table.page_table_host, idx, np.array(begins, dtype=np.int64), ends)
        return {r.table_idx: (since, tuple(new)) for r, since, new in zip(rows, sinces, gained)}
