"""The reference backend, which runs anywhere: torch SDPA reading K/V through the page table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..core import Batch
from .base import AttentionBackend


@dataclass
class TorchMetadata:
    q_lens: list[int]
    cached_lens: list[int]
    kv_slots: list[torch.Tensor] | None  # prefill: each request's slots [0, device_len)
    padded_slots: torch.Tensor | None  # decode: [batch, max_kv_len]
    padded_mask: torch.Tensor | None  # decode: [batch, 1, 1, max_kv_len], None if no padding


class TorchBackend(AttentionBackend):
    def prepare(self, batch: Batch) -> None:
        table_rows, cached, kv_lens = batch.ledger
        rows = self.table.page_table_host
        meta = TorchMetadata((kv_lens - cached).tolist(), cached.tolist(), None, None, None)
        device = self.pool.buffer.device
        if batch.is_prefill:
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
        batch.attn_metadata = meta

    def forward(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        batch: Batch,
    ) -> torch.Tensor:
        if k is not None:
            self.pool.store(layer_id, batch.out_loc, k, v)
        k_cache, v_cache = self.pool.k(layer_id), self.pool.v(layer_id)
        meta: TorchMetadata = batch.attn_metadata
        if meta.padded_slots is not None:
            keys = k_cache[meta.padded_slots].transpose(1, 2)
            values = v_cache[meta.padded_slots].transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q[:, :, None, :], keys, values, meta.padded_mask, enable_gqa=True
            )
            return out[:, :, 0, :]
        outs, start = [], 0
        for q_len, cached_len, slots in zip(meta.q_lens, meta.cached_lens, meta.kv_slots):
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
        return torch.cat(outs)
