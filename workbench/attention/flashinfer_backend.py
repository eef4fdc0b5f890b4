"""FlashInfer attention on the GPU. The page table is token-granular: page ``i`` of a request is
slot ``page_table[row, i * page_size] // page_size``, gathered on the device."""

from __future__ import annotations

import numpy as np
import torch

from ..core import Batch
from ..device import staging
from .base import AttentionBackend
from .flashinfer_graphs import (
    WORKSPACE_BYTES,
    FlashInferMetadata,
    GraphWrappers,
    TritonDecodeMetadata,
)
from .flashinfer_plan import PagedKV, Planner


class FlashInferBackend(AttentionBackend):
    def __init__(
        self,
        pool,
        table,
        num_heads: int,
        head_dim: int,
        decode_tensor_cores: bool | None = None,
        decode_split_kv: bool = True,
        decode_kernel: str = "flashinfer",
        pdl: bool = False,
    ) -> None:
        import flashinfer

        super().__init__(pool, table, num_heads, head_dim, decode_tensor_cores, decode_split_kv)
        self.triton_decode = decode_kernel == "triton"  # `kernels/decode_attention.py`
        self.pdl = pdl
        self.device = pool.buffer.device
        self.num_kv_heads = pool.buffer.shape[3]
        self.page_size = pool.page_size
        self.staging = staging(self.device)
        heads = (num_heads, self.num_kv_heads, head_dim, self.page_size)
        self.planner = Planner(self.staging, self.device, pool.buffer.dtype, heads)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        group = num_heads // self.num_kv_heads
        self.tensor_cores_above = tensor_cores_above(group, decode_tensor_cores)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )
        # eager decode steps: a wrapper on CUDA cores and one on tensor cores, made when needed
        self._decode_wrappers: dict[bool, object] = {}
        self.graphs = GraphWrappers(
            flashinfer,
            self.planner,
            table,
            self.workspace,
            self.tensor_cores_above,
            split_kv=decode_split_kv,
            triton_decode=self.triton_decode,
        )

    @property
    def decode_cores(self) -> str | None:
        """`tensor_cores_above` in words; None when decode steps run the Triton kernel."""
        above = self.tensor_cores_above
        if self.triton_decode:
            return None
        if above == 0:
            return "tensor cores"
        if above == float("inf"):
            return "CUDA cores"
        return f"CUDA cores up to {above} requests, tensor cores above"

    def decode_wrapper(self, batch_size: int):
        """The eager decode wrapper for `batch_size` requests (tensor cores above
        `tensor_cores_above`)."""
        tensor_cores = batch_size > self.tensor_cores_above
        if tensor_cores not in self._decode_wrappers:
            wrapper = self.graphs.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=tensor_cores, backend="fa2"
            )
            self._decode_wrappers[tensor_cores] = wrapper
        return self._decode_wrappers[tensor_cores]

    def _kv_indices(self, rows: np.ndarray, kv: PagedKV) -> torch.Tensor:
        from ..kernels.page_indices import page_indices

        rows_d, indptr_d = self.staging.send([rows.astype(np.int64), kv.indptr_np])
        indices = torch.empty(int(kv.indptr_np[-1]), dtype=torch.int32, device=self.device)
        return page_indices(self.table.page_table, rows_d, indptr_d, indices, self.page_size)

    def launched(self, timer) -> None:
        self.planner.launched(timer)

    def prepare(self, batch: Batch) -> None:
        rows, cached, kv_lens = batch.ledger
        if self.triton_decode and not batch.is_prefill:  # no plan: rows and lengths suffice
            rows_d, lens_d = self.staging.send([rows.astype(np.int64), kv_lens.astype(np.int32)])
            batch.attn_metadata = TritonDecodeMetadata(batch.out_loc, rows_d, lens_d)
            return
        kv = self.planner.paged(kv_lens)
        indices = self._kv_indices(rows, kv)
        if batch.is_prefill:
            qo = np.zeros(len(rows) + 1, dtype=np.int32)
            np.cumsum(kv_lens - cached, out=qo[1:])
            (qo_indptr,) = self.staging.host([qo])
            self.planner.plan(self.prefill_wrapper, qo_indptr, kv, indices)
            batch.attn_metadata = FlashInferMetadata(self.prefill_wrapper, batch.out_loc)
        else:
            wrapper = self.decode_wrapper(len(rows))
            self.planner.plan(wrapper, None, kv, indices)
            batch.attn_metadata = FlashInferMetadata(wrapper, batch.out_loc)

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
        meta: FlashInferMetadata | TritonDecodeMetadata = batch.attn_metadata
        if k is not None:
            self.pool.store(layer_id, meta.out_loc, k, v)
        if isinstance(meta, TritonDecodeMetadata):
            from ..kernels.decode_attention import decode_attention

            k_cache, v_cache = self.pool.k(layer_id), self.pool.v(layer_id)
            table, scale, pdl = self.table.page_table, self.head_dim**-0.5, self.pdl
            return decode_attention(
                q, k_cache, v_cache, table, meta.rows, meta.kv_lens, scale, pdl=pdl
            )
        shape = (-1, self.page_size, self.num_kv_heads, self.head_dim)
        kv = (self.pool.k(layer_id).view(shape), self.pool.v(layer_id).view(shape))
        return meta.wrapper.run(q, kv)


# Decode attention on CUDA cores at or below this many requests when the grouped query heads are
# 2 or 3 a KV head, on tensor cores above: on an H100, dummy Qwen3-0.6B (group 2), CUDA cores
# took 4-5% off steps of 8 and 64 requests of 500-600 tokens, nothing measurable off nano-vllm's
# ragged steps of at most 128, and made its steps above 128 4% slower (docs/performance.md,
# "FlashInfer's decode cores by batch size"). Their plan costs the host 0.1 ms a step more,
# hidden under the device's step with overlap.
CUDA_CORES_UP_TO = 128


def tensor_cores_above(group: int, asked: bool | None) -> int | float:
    """The batch size above which decode attention runs on tensor cores: 0 always, inf never.
    `asked` (the engine's `decode_tensor_cores`) True or False decides for every batch; None:
    tensor cores for groups of 4 or more query heads a KV head, CUDA cores for one (MHA), and
    for 2 or 3 CUDA cores up to `CUDA_CORES_UP_TO` requests."""
    if asked is not None:
        return 0 if asked else float("inf")
    if group >= 4:
        return 0
    return CUDA_CORES_UP_TO if group >= 2 else float("inf")
