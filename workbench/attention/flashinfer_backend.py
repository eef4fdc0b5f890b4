"""FlashInfer attention on the GPU: batched paged prefill and decode over the page table.

The page table is token-granular; FlashInfer gets the pool's real pages. Page ``i`` of a request
is slot ``page_table[row, i * page_size] // page_size`` (a page is ``page_size`` consecutive,
aligned slots, and a request's token ``p`` sits at offset ``p % page_size`` of its page). Those
index lists are gathered on the device (no trip through the host); only the small ``indptr`` and
last-page lengths are built on the host, which FlashInfer's planner wants there anyway. Pages of
16 tokens read the KV about 4% faster than pages of one (decode at batch 256 on the H200).

CUDA graphs: one decode wrapper per captured batch size, with fixed buffers. Before each replay
the wrapper is planned again for the real batch, padded with dummy requests that read and write
the pool's dummy slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from ..core import Batch
from ..device import host_tensor, to_device_many
from .base import AttentionBackend

WORKSPACE_BYTES = 256 * 2**20


class _PagedKV(NamedTuple):
    indptr: torch.Tensor  # [batch + 1] int32, host (pinned): where each request's pages start
    indices: torch.Tensor  # [pages] int32, device: page ids
    last_page_len: torch.Tensor  # [batch] int32, host (pinned): tokens in each last page
    lens: np.ndarray  # [batch]: KV tokens per request


@dataclass
class FlashInferMetadata:
    wrapper: Any  # the planned flashinfer wrapper whose run() this batch uses
    out_loc: torch.Tensor  # where each new token's K/V goes


class FlashInferBackend(AttentionBackend):
    supports_cuda_graph = True

    def __init__(self, pool, table, num_heads: int, head_dim: int, config=None) -> None:
        import flashinfer

        super().__init__(pool, table, num_heads, head_dim, config)
        self.flashinfer = flashinfer
        self.device = pool.buffer.device
        self.dtype = pool.buffer.dtype
        self.num_kv_heads = pool.buffer.shape[3]
        self.page_size = pool.page_size
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        # NOTE: tensor-core decode already pays at a GQA group of 2 (Qwen3-0.6B on the H200:
        # +5.7% and +6.3% on the throughput benchmark, two runs each way).
        choice = config.decode_tensor_cores if config is not None else None
        self.use_tensor_cores = num_heads // self.num_kv_heads >= 2 if choice is None else choice
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=self.use_tensor_cores, backend="fa2"
        )
        self.graph_wrappers: dict[int, Any] = {}
        self._graph_indices: torch.Tensor | None = None  # shared by the graph wrappers
        # NOTE: plan() fills a pinned host buffer and copies it to the device asynchronously;
        # planning again before that copy ran would overwrite the earlier batch's metadata
        # (with overlap the CPU is a step ahead). Each plan waits for the previous one's copy.
        self._plan_done = torch.cuda.Event()
        self._plan_done.record()

    # -- metadata ---------------------------------------------------------------------------
    def _kv_indices(self, rows: list[int], kv_lens: list[int]) -> _PagedKV:
        """The requests' pages covering KV positions ``[0, kv_len)``: host indptr and last-page
        lengths (pinned), device page ids."""
        ps = self.page_size
        lens = np.asarray(kv_lens, dtype=np.int64)
        num_pages = -(-lens // ps)
        indptr = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(num_pages, out=indptr[1:])
        total = int(indptr[-1])
        pages_d, rows_d, starts_d = to_device_many([num_pages, rows, indptr[:-1]], self.device)
        owner = torch.repeat_interleave(
            torch.arange(len(lens), device=self.device), pages_d, output_size=total
        )
        first_pos = (torch.arange(total, device=self.device) - starts_d[owner]) * ps
        indices = self.table.page_table[rows_d[owner], first_pos]
        if ps > 1:
            indices = indices // ps
        return _PagedKV(
            host_tensor(indptr, torch.int32, pinned=True),
            indices,
            host_tensor(lens - (num_pages - 1) * ps, torch.int32, pinned=True),
            lens,
        )

    def _plan(self, wrapper: Any, qo_indptr: torch.Tensor | None, kv: _PagedKV) -> None:
        # NOTE: every host tensor handed to plan() is pinned: a pageable one would make the
        # copy wait for the GPU to finish the batch in flight, and undo overlap.
        self._plan_done.synchronize()
        common = dict(q_data_type=self.dtype, kv_data_type=self.dtype)
        heads = (self.num_heads, self.num_kv_heads, self.head_dim, self.page_size)
        if qo_indptr is None:
            wrapper.plan(kv.indptr, kv.indices, kv.last_page_len, *heads, **common)
        else:
            wrapper.plan(
                qo_indptr,
                kv.indptr,
                kv.indices,
                kv.last_page_len,
                *heads,
                causal=True,
                seq_lens=host_tensor(kv.lens, torch.int32, pinned=True),
                **common,
            )
        self._plan_done.record()

    def prepare(self, batch: Batch) -> None:
        reqs = batch.reqs
        kv = self._kv_indices([r.table_idx for r in reqs], [r.device_len for r in reqs])
        if batch.is_prefill:
            qo = np.zeros(len(reqs) + 1, dtype=np.int64)
            np.cumsum([r.extend_len for r in reqs], out=qo[1:])
            qo_indptr = host_tensor(qo, torch.int32, pinned=True)
            self._plan(self.prefill_wrapper, qo_indptr, kv)
            batch.attn_metadata = FlashInferMetadata(self.prefill_wrapper, batch.out_loc)
        else:
            self._plan(self.decode_wrapper, None, kv)
            batch.attn_metadata = FlashInferMetadata(self.decode_wrapper, batch.out_loc)

    # -- CUDA graphs ------------------------------------------------------------------------
    def graph_metadata(self, bs: int, out_loc: torch.Tensor) -> FlashInferMetadata:
        """A wrapper for decode batches of exactly `bs` requests, planned with dummy requests."""
        if self._graph_indices is None:
            cap = self.table.max_running_reqs * self.table.max_seq_len + bs
            self._graph_indices = torch.zeros(cap, dtype=torch.int32, device=self.device)
        wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.use_tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device=self.device),
            paged_kv_indices_buffer=self._graph_indices,
            paged_kv_last_page_len_buffer=torch.ones(bs, dtype=torch.int32, device=self.device),
            backend="fa2",
        )
        self.graph_wrappers[bs] = wrapper
        self._plan(wrapper, None, self._kv_indices([self.table.dummy_row] * bs, [1] * bs))
        return FlashInferMetadata(wrapper, out_loc)

    def prepare_replay(self, batch: Batch, bs: int) -> None:
        """Plan the `bs` graph wrapper for this batch, padded with dummy requests."""
        pad = bs - batch.size
        rows = [r.table_idx for r in batch.reqs] + [self.table.dummy_row] * pad
        lens = [r.device_len for r in batch.reqs] + [1] * pad
        self._plan(self.graph_wrappers[bs], None, self._kv_indices(rows, lens))

    # -- the kernel -------------------------------------------------------------------------
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
