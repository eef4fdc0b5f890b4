"""Request slots, the page table and the token pool.

Both tables are ``[max_running_reqs + 1, max_seq_len]`` int32. The page table is token-granular
whatever the page size: entry ``[row, pos]`` is the KV slot of token ``pos`` of the request in
``row`` (a page is a run of ``page_size`` consecutive slots). The token pool holds input ids on the
device, so a decode step reads its inputs without a trip through the host. The last row belongs
to the dummy request that pads CUDA-graph batches.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np
import torch

from ..device import send_arrays, to_device


class TableManager:
    def __init__(self, max_running_reqs: int, max_seq_len: int, device: torch.device) -> None:
        rows = max_running_reqs + 1
        self.max_running_reqs, self.max_seq_len = max_running_reqs, max_seq_len
        self.dummy_row = max_running_reqs
        self.device = device
        # NOTE: the host copy is the bookkeeping truth (allocation, freeing, records); the device
        # copy feeds kernels. On the CPU they are one and the same memory.
        self.page_table_host = np.zeros((rows, max_seq_len), dtype=np.int32)
        if device.type == "cpu":
            self.page_table = torch.from_numpy(self.page_table_host)
        else:
            self.page_table = torch.zeros((rows, max_seq_len), dtype=torch.int32, device=device)
        # NOTE: zeros, so the dummy row reads valid token ids.
        self.token_pool = torch.zeros((rows, max_seq_len), dtype=torch.int32, device=device)
        self._free_rows = list(range(max_running_reqs - 1, -1, -1))
        # NOTE: writes per row that may change entries written before (a matched prefix, a
        # prompt's pages swapped for the prefix cache's): a snapshot that reads only what a row
        # gained since the last one (record="full") must read such a row whole again
        self.rewrites = np.zeros(rows, dtype=np.int64)
        # NOTE: with tensor parallelism, rank 0's writes since its last step, which the other
        # ranks replay on their tables before running the same step (None: not kept)
        self.journal: list[TableWrite] | None = None

    @property
    def available_size(self) -> int:
        return len(self._free_rows)

    def allocate(self) -> int:
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        assert row not in self._free_rows, f"request slot {row} freed twice"
        self._free_rows.append(row)

    def write_tokens(self, row: int, start: int, token_ids: list[int]) -> None:
        if self.journal is not None:
            self.journal.append(WriteTokens(row, start, token_ids))
        src = to_device(token_ids, self.device, torch.int32)
        self.token_pool[row, start : start + len(token_ids)].copy_(src)

    def write_row(self, row: int, start: int, slots: np.ndarray) -> None:
        """Point ``[row, start : start + len(slots)]`` at KV slots, on the host and the device."""
        if self.journal is not None:
            self.journal.append(WriteRow(row, start, slots))
        self.page_table_host[row, start : start + len(slots)] = slots
        self.rewrites[row] += 1
        if self.device.type != "cpu":
            src = to_device(slots, self.device, torch.int32)
            self.page_table[row, start : start + len(slots)].copy_(src)

    def write_slots(
        self, rows: np.ndarray, cols: np.ndarray, slots: np.ndarray, device: bool = True
    ) -> None:
        """Point page-table entries at KV slots, on the host and (unless `device` is False: a
        CUDA graph writes them itself, `engine/graph.py`) on the device."""
        if self.journal is not None:
            self.journal.append(WriteSlots(rows, cols, slots))
        self.page_table_host[rows, cols] = slots
        if device and self.device.type != "cpu":
            rows_d, cols_d, slots_d = send_arrays(
                [
                    np.asarray(rows, np.int64),
                    np.asarray(cols, np.int64),
                    np.asarray(slots, np.int32),
                ],
                self.device,
            )
            self.page_table.index_put_((rows_d, cols_d), slots_d)

    def replay(self, journal: list[TableWrite]) -> None:
        """Make another table's writes (rank 0's, on another rank) on this one."""
        for write in journal:
            write.apply(self)

    def digest(self) -> str:
        """A fingerprint of the page table (the host's) and the token pool."""
        h = hashlib.sha1(self.page_table_host.tobytes())
        h.update(self.token_pool.cpu().numpy().tobytes())
        return h.hexdigest()


# -- the writes a journal keeps -------------------------------------------------------------
class WriteTokens(NamedTuple):
    row: int
    start: int
    token_ids: list[int]

    def apply(self, table: TableManager) -> None:
        table.write_tokens(self.row, self.start, self.token_ids)


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


TableWrite = WriteTokens | WriteRow | WriteSlots
