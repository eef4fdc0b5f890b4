"""The CUDA-graph side of the FlashInfer backend: one wrapper per captured shape, with fixed
buffers, planned again before each replay by FlashInfer's scheduler alone (`Replan`).

Decode: one decode wrapper per captured batch size; the real batch is padded with dummy
requests that read and write the pool's dummy slot, and the graph itself gathers the page ids
(`graph_indices`). Prefill and mixed steps: one prefill wrapper per captured (tokens, rows);
the requests past a batch's own have no queries and one dummy page, its padding tokens belong
to no request (FlashInfer leaves their attention output zero).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .flashinfer_replan import Replan, split_kv_bytes

WORKSPACE_BYTES = 256 * 2**20  # FlashInfer's float workspace, shared by the eager wrappers


@dataclass
class FlashInferMetadata:
    wrapper: Any  # the planned flashinfer wrapper whose run() this batch uses
    out_loc: torch.Tensor  # where each new token's K/V goes


class GraphWrappers:
    """The graph wrappers of `FlashInferBackend` (a mixin: it uses the backend's planning,
    staging and metadata)."""

    def _init_graph_wrappers(self) -> None:
        self.graph_wrappers: dict[int, Any] = {}  # decode: batch size -> wrapper
        self._graph_indices: torch.Tensor | None = None  # shared by all graph wrappers
        self._replans: dict[int, Replan | None] = {}  # each decode graph wrapper's planner
        # prefill and mixed: (tokens, rows) -> its wrapper's planner; the workspaces they share
        self._prefill_replans: dict[tuple[int, int], Replan] = {}
        self._prefill_floats: torch.Tensor | None = None
        self._prefill_ints: tuple[torch.Tensor, torch.Tensor] | None = None  # device, pinned

    def paged_lens(self, kv_lens: np.ndarray, indptr: np.ndarray, last_page_len: np.ndarray):
        """`paged_lens` for this pool's page size."""
        paged_lens(kv_lens, self.page_size, indptr, last_page_len)

    def graph_metadata(
        self, bs: int, out_loc: torch.Tensor, indptr: torch.Tensor, last_page_len: torch.Tensor
    ) -> FlashInferMetadata:
        """A wrapper for decode batches of exactly `bs` requests, planned with dummy requests.
        `indptr` and `last_page_len` are its device buffers, which the caller fills before
        each replay (the graph runner's one staged copy); the graph gathers the page ids
        (`graph_indices`)."""
        wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.use_tensor_cores,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=self.graph_indices_buffer(),
            paged_kv_last_page_len_buffer=last_page_len,
            backend="fa2",
        )
        self.graph_wrappers[bs] = wrapper
        kv_lens = np.ones(bs, dtype=np.int32)
        self._plan(wrapper, None, self._paged(kv_lens), self._graph_indices[:0])
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, self.page_size)
        known = self.use_tensor_cores  # CUDA-core decode has a planner of its own
        self._replans[bs] = Replan.of(wrapper, heads, bs, bs, False) if known else None
        if self._replans[bs] is not None:  # it must plan what plan() planned
            indptr, last = np.empty(bs + 1, np.int32), np.empty(bs, np.int32)
            self.paged_lens(kv_lens, indptr, last)
            self.plan_replay(bs, indptr, kv_lens)
        return FlashInferMetadata(wrapper, out_loc)

    def plan_replay(self, bs: int, indptr: np.ndarray, kv_lens: np.ndarray) -> None:
        """Plan the `bs` graph wrapper for these KV lengths (the batch's, then 1 for each
        dummy request that pads it to `bs`) and page `indptr`, on the host. Its device
        `indptr` and `last_page_len` are the caller's to fill; the graph gathers the page ids.

        Only FlashInfer's scheduler runs (`Replan`)."""
        replan = self._replans[bs]
        self._before_plan()
        if replan is None:  # a planner we do not know: the wrapper's own plan()
            kv = self._paged(kv_lens.astype(np.int64))
            self.graph_wrappers[bs].plan(
                kv.indptr,
                self._graph_indices[:0],
                kv.last_page_len,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.page_size,
                q_data_type=self.dtype,
                kv_data_type=self.dtype,
                seq_lens=kv.seq_lens,
            )
        else:
            replan(indptr, kv_lens)
        self._unlaunched = True

    def graph_indices(self, rows: torch.Tensor, indptr: torch.Tensor) -> None:
        """Inside a graph: the page ids of the requests in `rows`, as the graph's `indptr`
        buffer places them (its last plan's), from the device's page table into the buffer the
        graph wrappers read."""
        from ..kernels.page_indices import page_indices

        buffer = self.graph_indices_buffer()
        page_indices(self.table.page_table, rows, indptr, buffer, self.page_size)

    def graph_indices_buffer(self) -> torch.Tensor:
        """The page ids every graph wrapper reads (each graph gathers its batch's before its
        attention runs): room for every request slot's whole row, and a page for each padded
        request."""
        if self._graph_indices is None:
            table = self.table
            cap = (table.max_running_reqs + 1) * (table.max_seq_len + 1)
            self._graph_indices = torch.zeros(cap, dtype=torch.int32, device=self.device)
        return self._graph_indices

    # -- CUDA graphs of prefill and mixed steps ---------------------------------------------
    def prefill_graph_metadata(
        self, shape: tuple[int, int], out_loc: torch.Tensor, buffers: dict[str, torch.Tensor]
    ) -> FlashInferMetadata | None:
        """A prefill wrapper for batches of `shape` = (at most `tokens` query tokens, exactly
        `rows` requests: those past a batch's own have no queries and one dummy KV page).
        `buffers`: its device ``qo_indptr``, ``kv_indptr`` and ``last_page_len``, which the
        caller fills before each replay, and planned here for the dummy batch the graph is
        captured with (`dummy_prefill`), written to them too. None: FlashInfer's planner is
        not one `Replan` knows, and prefill steps stay eager."""
        tokens, rows = shape
        wrapper = self.flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._prefill_workspace(tokens, rows),
            "NHD",
            use_cuda_graph=True,
            qo_indptr_buf=buffers["qo_indptr"],
            paged_kv_indptr_buf=buffers["kv_indptr"],
            paged_kv_indices_buf=self.graph_indices_buffer(),
            paged_kv_last_page_len_buf=buffers["last_page_len"],
            backend="fa2",
        )
        self._share_int_workspace(wrapper)
        qo, kv_lens = dummy_prefill(tokens, rows)
        kv = self._paged(kv_lens)
        (qo_host,) = self.staging.host([qo])
        self._plan(wrapper, qo_host, kv, self.graph_indices_buffer()[:0])
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, self.page_size)
        replan = Replan.of(wrapper, heads, rows, tokens, True)
        if replan is None:
            return None
        self._prefill_replans[shape] = replan
        self.plan_prefill_replay(shape, qo, kv.indptr_np, kv_lens)  # checks it plans the same
        return FlashInferMetadata(wrapper, out_loc)

    def plan_prefill_replay(
        self, shape: tuple[int, int], qo_indptr: np.ndarray, indptr: np.ndarray, kv_lens: np.ndarray
    ) -> None:
        """Plan the `shape` graph wrapper for these query `qo_indptr`, page `indptr` and KV
        lengths (host arrays, padded to its rows); its device buffers are the caller's."""
        self._before_plan()
        self._prefill_replans[shape](indptr, kv_lens, qo_indptr)
        self._unlaunched = True

    def _prefill_workspace(self, tokens: int, rows: int) -> torch.Tensor:
        """The float workspace of the prefill graphs, shared (one replays at a time): the
        eager wrappers' when the split KV of `tokens` x `rows` fits in it (called largest
        first)."""
        if self._prefill_floats is None:
            sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
            need = split_kv_bytes(
                rows, tokens, self.num_heads, self.num_kv_heads, self.head_dim, sm_count
            )
            self._prefill_floats = self.workspace
            if need > WORKSPACE_BYTES:
                self._prefill_floats = torch.zeros(need, dtype=torch.uint8, device=self.device)
        return self._prefill_floats

    def _share_int_workspace(self, wrapper: Any) -> None:
        """Give `wrapper` the int workspace (device and pinned) of the first prefill graph
        wrapper: FlashInfer allocates 8 MB of each per wrapper, and a prefill graph's plan is
        always written again before it replays (stream order keeps the device copy's turn; the
        pinned one is reused only after its copy ran, `_before_plan`). A wrapper without these
        attributes keeps its own (and `Replan` refuses it)."""
        names = ("_int_workspace_buffer", "_pin_memory_int_workspace_buffer")
        if not all(hasattr(wrapper, n) for n in names):
            return
        if self._prefill_ints is None:
            self._prefill_ints = tuple(getattr(wrapper, n) for n in names)
        else:
            wrapper._int_workspace_buffer, wrapper._pin_memory_int_workspace_buffer = (
                self._prefill_ints
            )


def paged_lens(
    kv_lens: np.ndarray, page_size: int, indptr: np.ndarray, last_page_len: np.ndarray
) -> None:
    """Fill each request's page `indptr` (one longer than `kv_lens`: where its pages start in
    the batch's page list) and last-page length, for these KV lengths, in place."""
    indptr[0] = 0
    if page_size == 1:
        np.cumsum(kv_lens, out=indptr[1:])
        last_page_len[:] = 1
        return
    num_pages = -(-kv_lens // page_size)
    np.cumsum(num_pages, out=indptr[1:])
    last_page_len[:] = kv_lens - (num_pages - 1) * page_size


def dummy_prefill(tokens: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch a prefill graph of (`tokens`, `rows`) is captured with: all `tokens` query
    tokens spread over the `rows` requests, each attending to itself only (its KV that long),
    as the query `qo_indptr` and the KV lengths."""
    q_lens = np.full(rows, tokens // rows, dtype=np.int64)
    q_lens[: tokens % rows] += 1
    qo = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(q_lens, out=qo[1:])
    return qo, q_lens.astype(np.int32)
