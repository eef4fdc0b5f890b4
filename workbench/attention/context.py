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
