"""What the layers of one forward share: the attention backend and the batch being run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..core import Batch
    from .base import AttentionBackend


class ForwardContext:
    def __init__(self, backend: AttentionBackend) -> None:
        self.backend = backend
        self.batch: Batch | None = None  # set by `running` around each forward
        # int32 [MoE layers, experts]: tokens each expert received this forward, or None (a
        # dense model); zeroed by the engine before each forward, added to by `route`
        self.routing: torch.Tensor | None = None
        # int32 [tokens]: 1 for the batch's tokens, 0 for a CUDA graph's padding, filled by the
        # graph runners before each replay; None (eager): every token counts
        self.counted: torch.Tensor | None = None

    @contextlib.contextmanager
    def running(self, batch: Batch) -> Iterator[ForwardContext]:
        self.batch = batch
        try:
            yield self
        finally:
            self.batch = None

    def attend(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None
    ) -> torch.Tensor:
        return self.backend.forward(layer_id, q, k, v, self.batch)

    def kv_target(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where this layer's new K and V go: the pool's K and V buffers and each token's slot."""
        pool = self.backend.pool
        return pool.k(layer_id), pool.v(layer_id), self.backend.out_loc(self.batch)

    def route(self, moe_index: int, expert_ids: torch.Tensor) -> None:
        """Count the experts MoE layer `moe_index` chose (`expert_ids`: [tokens, top_k]), with no
        host sync (safe inside a CUDA graph); a graph's padding tokens add 0 (`counted`)."""
        if self.routing is None:
            return
        ids = expert_ids.reshape(-1)
        if self.counted is None:
            weights = torch.ones_like(ids, dtype=torch.int32)
        else:
            weights = self.counted[:, None].expand(expert_ids.shape).reshape(-1)
        self.routing[moe_index].index_add_(0, ids, weights)
