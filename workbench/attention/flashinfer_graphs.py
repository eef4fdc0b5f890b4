"""The CUDA-graph side of the FlashInfer backend: one wrapper per captured shape, with fixed
buffers, planned again before each replay by FlashInfer's scheduler alone (`Replan`). A batch is
padded to its graph's shape with dummy requests on the pool's dummy slot (in prefill graphs they
have no queries, and padding tokens belong to no request: FlashInfer leaves their output zero)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .flashinfer_replan import Replan, split_kv_bytes

WORKSPACE_BYTES = 256 * 2**20  # FlashInfer's float workspace, shared by the eager wrappers


@dataclass
class FlashInferMetadata:
    wrapper: Any
    out_loc: torch.Tensor


class GraphWrappers:
    """The graph wrappers of `FlashInferBackend` (a mixin over its planning and staging). The
    caller fills each graph's device buffers (``indptr``, ``last_page_len``, ``qo_indptr``) before
    a replay, and the graph gathers its page ids itself (`graph_indices`)."""

    def _init_graph_wrappers(self) -> None:
        self.graph_wrappers: dict[int, Any] = {}  # decode: batch size -> wrapper
        self._graph_indices: torch.Tensor | None = None
        self._replans: dict[int, Replan | None] = {}
        # prefill and mixed: (tokens, rows) -> its wrapper's planner; the workspaces they share
        self._prefill_replans: dict[tuple[int, int], Replan] = {}
        self._prefill_floats: torch.Tensor | None = None
        self._prefill_ints: tuple[torch.Tensor, torch.Tensor] | None = None  # device, pinned

    def paged_lens(self, kv_lens: np.ndarray, indptr: np.ndarray, last_page_len: np.ndarray):
        paged_lens(kv_lens, self.page_size, indptr, last_page_len)

    def graph_metadata(
        self, bs: int, out_loc: torch.Tensor, indptr: torch.Tensor, last_page_len: torch.Tensor
    ) -> FlashInferMetadata:
        """A wrapper for decode batches of exactly `bs` requests, planned with dummy requests."""
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
        """Plan the `bs` graph wrapper for these page `indptr` and KV lengths (1 per dummy)."""
        replan = self._replans[bs]
        self._before_plan()
        if replan is None:
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
        """Inside a graph: the page ids of the requests in `rows`, where `indptr` places them."""
        from ..kernels.page_indices import page_indices

        buffer = self.graph_indices_buffer()
        page_indices(self.table.page_table, rows, indptr, buffer, self.page_size)

    def graph_indices_buffer(self) -> torch.Tensor:
        """Page ids all graph wrappers read: a row per request slot, a page per padded request."""
        if self._graph_indices is None:
            table = self.table
            cap = (table.max_running_reqs + 1) * (table.max_seq_len + 1)
            self._graph_indices = torch.zeros(cap, dtype=torch.int32, device=self.device)
        return self._graph_indices

    def prefill_graph_metadata(
        self, shape: tuple[int, int], out_loc: torch.Tensor, buffers: dict[str, torch.Tensor]
    ) -> FlashInferMetadata | None:
        """A prefill wrapper for batches of at most `tokens` query tokens and exactly `rows`
        requests; `buffers`: its device ``qo_indptr``, ``kv_indptr`` and ``last_page_len``. None:
        `Replan` does not know this FlashInfer's planner, and prefill steps stay eager."""
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
        self._before_plan()
        self._prefill_replans[shape](indptr, kv_lens, qo_indptr)
        self._unlaunched = True

    def _prefill_workspace(self, tokens: int, rows: int) -> torch.Tensor:
        """The prefill graphs' float workspace, shared as one replays at a time: the eager
        wrappers' when the split KV of the first (largest) shape fits in it."""
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
        """Give `wrapper` the first prefill graph wrapper's int workspaces (device and pinned, 8 MB
        each): a prefill graph's plan is always written again before it replays, once the last
        copy ran (`_before_plan`). A wrapper without these attributes keeps its own."""
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
    """Fill each request's page `indptr` and last-page length for these KV lengths, in place."""
    indptr[0] = 0
    if page_size == 1:
        np.cumsum(kv_lens, out=indptr[1:])
        last_page_len[:] = 1
        return
    num_pages = -(-kv_lens // page_size)
    np.cumsum(num_pages, out=indptr[1:])
    last_page_len[:] = kv_lens - (num_pages - 1) * page_size


def dummy_prefill(tokens: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch a prefill graph is captured with, as (`qo_indptr`, KV lengths): the `tokens`
    spread over the `rows` requests, each attending to itself only."""
    q_lens = np.full(rows, tokens // rows, dtype=np.int64)
    q_lens[: tokens % rows] += 1
    qo = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(q_lens, out=qo[1:])
    return qo, q_lens.astype(np.int32)
