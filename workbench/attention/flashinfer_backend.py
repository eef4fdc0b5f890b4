"""FlashInfer attention on the GPU: batched paged prefill and decode over the page table.

The page table is token-granular, so page ``i`` of a request is slot
``page_table[row, i * page_size] // page_size``; those page ids are gathered on the device
(`kernels/page_indices.py`), and only ``indptr`` and lengths are built on the host."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from ..core import Batch
from ..device import staging
from .base import AttentionBackend
from .flashinfer_graphs import WORKSPACE_BYTES, FlashInferMetadata, GraphWrappers


class _PagedKV(NamedTuple):
    """A batch's KV pages as FlashInfer's planner wants them, on the host (pinned)."""

    indptr: torch.Tensor
    last_page_len: torch.Tensor
    seq_lens: torch.Tensor
    indptr_np: np.ndarray


class FlashInferBackend(GraphWrappers, AttentionBackend):
    supports_cuda_graph = True

    def __init__(
        self, pool, table, num_heads: int, head_dim: int, decode_tensor_cores: bool | None = None
    ) -> None:
        import flashinfer

        super().__init__(pool, table, num_heads, head_dim, decode_tensor_cores)
        self.flashinfer = flashinfer
        self.device = pool.buffer.device
        self.dtype = pool.buffer.dtype
        self.num_kv_heads = pool.buffer.shape[3]
        self.page_size = pool.page_size
        self.staging = staging(self.device)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        # tensor cores from GQA group 2, and fa2: faster kernels (benchmarks/decode_attention.py)
        gqa = num_heads // self.num_kv_heads >= 2
        self.use_tensor_cores = gqa if decode_tensor_cores is None else decode_tensor_cores
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.use_tensor_cores, backend="fa2"
        )
        self._init_graph_wrappers()
        # NOTE: plan() copies a pinned host buffer to the device asynchronously, and with overlap
        # the next plan could overwrite it first. Each plan waits for the previous one's copy: for
        # its step's start (`launched`), or for the stream when it never launched.
        self._plan_done: torch.cuda.Event | None = None
        self._unlaunched = False

    def _paged(self, kv_lens: np.ndarray) -> _PagedKV:
        ps = self.page_size
        num_pages = -(-kv_lens // ps)
        indptr = np.zeros(len(kv_lens) + 1, dtype=np.int32)
        np.cumsum(num_pages, out=indptr[1:])
        last = (kv_lens - (num_pages - 1) * ps).astype(np.int32)
        host = self.staging.host([indptr, last, kv_lens.astype(np.int32)])
        return _PagedKV(*host, indptr)

    def _kv_indices(self, rows: np.ndarray, kv: _PagedKV) -> torch.Tensor:
        from ..kernels.page_indices import page_indices

        rows_d, indptr_d = self.staging.send([rows.astype(np.int64), kv.indptr_np])
        indices = torch.empty(int(kv.indptr_np[-1]), dtype=torch.int32, device=self.device)
        return page_indices(self.table.page_table, rows_d, indptr_d, indices, self.page_size)

    def _plan(
        self, wrapper: Any, qo_indptr: torch.Tensor | None, kv: _PagedKV, indices: torch.Tensor
    ) -> None:
        # NOTE: every host tensor handed to plan() is pinned: a pageable one would make the
        # copy wait for the GPU to finish the batch in flight, and undo overlap.
        self._before_plan()
        common = dict(q_data_type=self.dtype, kv_data_type=self.dtype, seq_lens=kv.seq_lens)
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, self.page_size)
        if qo_indptr is None:
            wrapper.plan(kv.indptr, indices, kv.last_page_len, *heads, **common)
        else:
            wrapper.plan(
                qo_indptr, kv.indptr, indices, kv.last_page_len, *heads, causal=True, **common
            )
        self._unlaunched = True

    def _before_plan(self) -> None:
        if self._unlaunched:
            torch.cuda.current_stream(self.device).synchronize()
        elif self._plan_done is not None:
            self._plan_done.synchronize()

    def launched(self, timer) -> None:
        self._plan_done, self._unlaunched = timer.started, False

    def prepare(self, batch: Batch) -> None:
        rows, cached, kv_lens = batch.ledger
        kv = self._paged(kv_lens)
        indices = self._kv_indices(rows, kv)
        if batch.is_prefill:
            qo = np.zeros(len(rows) + 1, dtype=np.int32)
            np.cumsum(kv_lens - cached, out=qo[1:])
            (qo_indptr,) = self.staging.host([qo])
            self._plan(self.prefill_wrapper, qo_indptr, kv, indices)
            batch.attn_metadata = FlashInferMetadata(self.prefill_wrapper, batch.out_loc)
        else:
            self._plan(self.decode_wrapper, None, kv, indices)
            batch.attn_metadata = FlashInferMetadata(self.decode_wrapper, batch.out_loc)

    def out_loc(self, batch: Batch) -> torch.Tensor:
        return batch.attn_metadata.out_loc  # a graph's static buffer when replayed

    def forward(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        batch: Batch,
    ) -> torch.Tensor:
        meta: FlashInferMetadata = batch.attn_metadata
        if k is not None:
            self.pool.store(layer_id, meta.out_loc, k, v)
        shape = (-1, self.page_size, self.num_kv_heads, self.head_dim)
        kv = (self.pool.k(layer_id).view(shape), self.pool.v(layer_id).view(shape))
        return meta.wrapper.run(q, kv)
