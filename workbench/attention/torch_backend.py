"""The reference backend, which runs anywhere: torch SDPA reading K/V through the page table."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..core import Batch
from .base import AttentionBackend, paged_lens


@dataclass
class TorchMetadata:
    q_lens: list[int]
    cached_lens: list[int]
    kv_slots: list[torch.Tensor] | None  # prefill: each request's slots [0, device_len)
    padded_slots: torch.Tensor | None  # decode: [batch, max_kv_len]
    padded_mask: torch.Tensor | None  # decode: [batch, 1, 1, max_kv_len], None if no padding


@dataclass
class PaddedMetadata:
    """A padded graph shape's (`engine/graph.py`): its static `out_loc` and the plan of the
    step it runs now (requests without a query token and tokens of no request are padding)."""

    out_loc: torch.Tensor
    step: TorchMetadata | None = None


class TorchBackend(AttentionBackend):
    def __init__(self, pool, table, num_heads: int, head_dim: int, **kwargs) -> None:
        super().__init__(pool, table, num_heads, head_dim, **kwargs)
        self.graphs = TorchGraphs(self)

    def prepare(self, batch: Batch) -> None:
        rows, cached, kv_lens = batch.ledger
        batch.attn_metadata = self.metadata(rows, cached, kv_lens, batch.is_prefill)

    def metadata(
        self, table_rows: np.ndarray, cached: np.ndarray, kv_lens: np.ndarray, prefill: bool
    ) -> TorchMetadata:
        """Each request's KV slots from the host's page table (written ahead of the device's)."""
        rows = self.table.page_table_host
        meta = TorchMetadata((kv_lens - cached).tolist(), cached.tolist(), None, None, None)
        device = self.pool.buffer.device
        if prefill:
            meta.kv_slots = [
                torch.from_numpy(rows[row, :n].astype(np.int64)).to(device)
                for row, n in zip(table_rows.tolist(), kv_lens.tolist())
            ]
        else:
            width = int(kv_lens.max())
            valid = np.arange(width)[None, :] < kv_lens[:, None]
            slots = np.where(valid, rows[table_rows, :width], self.pool.dummy_slot)
            meta.padded_slots = torch.from_numpy(slots.astype(np.int64)).to(device)
            if not valid.all():
                meta.padded_mask = torch.from_numpy(valid)[:, None, None, :].to(device)
        return meta

    def out_loc(self, batch: Batch) -> torch.Tensor:
        meta = batch.attn_metadata
        return meta.out_loc if isinstance(meta, PaddedMetadata) else batch.out_loc

    def forward(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        batch: Batch,
    ) -> torch.Tensor:
        if k is not None:
            self.pool.store(layer_id, self.out_loc(batch), k, v)
        k_cache, v_cache = self.pool.k(layer_id), self.pool.v(layer_id)
        meta = batch.attn_metadata
        if isinstance(meta, PaddedMetadata):
            meta = meta.step
        if meta.padded_slots is not None:
            keys = k_cache[meta.padded_slots].transpose(1, 2)
            values = v_cache[meta.padded_slots].transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q[:, :, None, :], keys, values, meta.padded_mask, enable_gqa=True
            )
            return out[:, :, 0, :]
        outs, start = [], 0
        for q_len, cached_len, slots in zip(meta.q_lens, meta.cached_lens, meta.kv_slots):
            if q_len == 0:  # a padding request
                continue
            query = q[start : start + q_len].transpose(0, 1)[None]
            keys = k_cache[slots].transpose(0, 1)[None]
            values = v_cache[slots].transpose(0, 1)[None]
            mask = None
            if cached_len > 0:  # query i sits at position cached_len + i: keys [0, cached_len + i]
                mask = torch.ones(q_len, cached_len + q_len, dtype=torch.bool, device=q.device)
                mask = mask.tril(diagonal=cached_len)
            out = F.scaled_dot_product_attention(
                query, keys, values, mask, is_causal=mask is None and q_len > 1, enable_gqa=True
            )
            outs.append(out[0].transpose(0, 1))
            start += q_len
        if start < len(q):  # a padded shape's tokens of no request
            outs.append(q.new_zeros(len(q) - start, *q.shape[1:]))
        return torch.cat(outs)


class TorchGraphs:
    """The torch backend's side of the padded graph shapes (`engine/graph.py`, the interface of
    `flashinfer_graphs.GraphWrappers`): they run eagerly, never captured; each step's plan is
    made from its host inputs, as an eager step's is."""

    capturable = False

    def __init__(self, backend: TorchBackend) -> None:
        # (a proxy, not a cycle: a closed engine's KV pool is freed without a garbage collection)
        self.backend = weakref.proxy(backend)
        self._metadata: dict[object, PaddedMetadata] = {}  # shape -> its metadata

    def paged_lens(self, kv_lens: np.ndarray, indptr: np.ndarray, last_page_len: np.ndarray):
        paged_lens(kv_lens, self.backend.pool.page_size, indptr, last_page_len)

    def metadata(self, shape, x: dict[str, torch.Tensor]) -> PaddedMetadata:
        self._metadata[shape] = PaddedMetadata(x["out_loc"])
        return self._metadata[shape]

    def plan(self, shape, x: dict[str, np.ndarray]) -> None:
        kv_lens = x["kv_lens"].astype(np.int64)
        cached = kv_lens - np.diff(x["qo_indptr"])
        meta = self.backend.metadata(x["rows"], cached, kv_lens, prefill=not shape.decode)
        self._metadata[shape].step = meta

    def graph_indices(self, shape, rows: torch.Tensor, indptr: torch.Tensor) -> None:
        """Inside a step: nothing (`plan` read the slots from the host's page table)."""
