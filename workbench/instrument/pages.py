"""Page-table rows as runs of consecutive KV slots: what each row gained in a step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..core import ReqView
    from ..kvcache.table import TableManager


def slot_runs(
    page_table: np.ndarray, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> list[list[tuple[int, int, int]]]:
    """Row `idx[i]`'s entries ``[starts[i], ends[i])`` as runs ``(pos_start, pos_end, slot)``."""
    lens = ends - starts
    first = np.cumsum(lens) - lens
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
    """Each batch's page-table rows as slot runs (record="full"), only what a row gained since
    it was last taken: whole rows at every step would grow with steps x rows x length."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[int, int, int, int]] = {}  # (uid, rewrites, len, since)

    def take(self, table: TableManager, rows: list[ReqView], step: int) -> dict[int, tuple]:
        """Row -> (since, runs gained): `since` is the step from which its runs are listed."""
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
