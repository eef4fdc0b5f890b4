"""Request slots, the page table and the token pool, ``[max_running_reqs + 1, max_seq_len]`` int32.
The page table is token-granular: ``[row, pos]`` is the KV slot of token ``pos``. The last row is
the dummy request that pads CUDA-graph batches."""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np
import torch

from ..device import to_device


class TableManager:
    def __init__(self, max_running_reqs: int, max_seq_len: int, device: torch.device) -> None:
        rows = max_running_reqs + 1
        self.max_running_reqs, self.max_seq_len = max_running_reqs, max_seq_len
        self.dummy_row = max_running_reqs
        self.device = device
        # NOTE: the host copy is the bookkeeping truth; the device copy (same on CPU) feeds kernels
        self.page_table_host = np.zeros((rows, max_seq_len), dtype=np.int32)
        self.shares_host_memory = device.type == "cpu"
        if self.shares_host_memory:
            self.page_table = torch.from_numpy(self.page_table_host)
        else:
            self.page_table = torch.zeros((rows, max_seq_len), dtype=torch.int32, device=device)
        # NOTE: zeros, so the dummy row reads valid token ids
        self.token_pool = torch.zeros((rows, max_seq_len), dtype=torch.int32, device=device)
        self._free_rows = list(range(max_running_reqs - 1, -1, -1))
        # NOTE: an incremental snapshot (record="full") must reread a row counted here whole
        self.rewrites = np.zeros(rows, dtype=np.int64)
        # rank 0's writes since its last step, which the other TP ranks replay (None: not kept)
        self.journal: list[TableWrite] | None = None
        # rows rewritten on the host only, sent to the device with the next step (`sync_device`)
        self.unsynced: list[tuple[int, int, np.ndarray]] = []

    @property
    def available_size(self) -> int:
        return len(self._free_rows)

    def allocate(self) -> int:
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        assert row not in self._free_rows, f"request slot {row} freed twice"
        self._free_rows.append(row)

    def write_row(self, row: int, start: int, slots: np.ndarray) -> None:
        """Point ``[row, start : start + len(slots)]`` at the KV slots of tokens already computed
        (a matched prefix, pages swapped for the prefix cache's)."""
        if self.journal is not None:
            self.journal.append(WriteRow(row, start, slots))
        self.page_table_host[row, start : start + len(slots)] = slots
        self.rewrites[row] += 1
        if not self.shares_host_memory:
            self.unsynced.append((row, start, slots))

    def sync_device(self) -> None:
        unsynced, self.unsynced = self.unsynced, []
        for row, start, slots in unsynced:
            src = to_device(slots, self.device, torch.int32)
            self.page_table[row, start : start + len(slots)].copy_(src)

    def write_slots(self, rows: np.ndarray, cols: np.ndarray, slots: np.ndarray) -> None:
        """Point page-table entries of tokens not computed yet at KV slots, on the host only."""
        if self.journal is not None:
            self.journal.append(WriteSlots(rows, cols, slots))
        self.page_table_host[rows, cols] = slots

    def replay(self, journal: list[TableWrite]) -> None:
        """Make another table's writes (rank 0's, on another rank) on this one."""
        for write in journal:
            write.apply(self)

    def digest(self) -> str:
        """A fingerprint of the page table (the host's) and the token pool."""
        h = hashlib.sha1(self.page_table_host.tobytes())
        h.update(self.token_pool.cpu().numpy().tobytes())
        return h.hexdigest()


class WriteRow(NamedTuple):
    row: int
    start: int
    slots: np.ndarray

    def apply(self, table: TableManager) -> None:
        table.write_row(self.row, self.start, self.slots)


class WriteSlots(NamedTuple):
    rows: np.ndarray
    cols: np.ndarray
    slots: np.ndarray

    def apply(self, table: TableManager) -> None:
        table.write_slots(self.rows, self.cols, self.slots)


TableWrite = WriteRow | WriteSlots
