"""What the layers of one forward share: the attention backend and the batch being run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..attention.base import AttentionBackend
    from ..core import Batch


class ForwardContext:
    def __init__(self, backend: AttentionBackend) -> None:
        self.backend = backend
        self.batch: Batch | None = None  # set by the engine around each forward

    def attend(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        return self.backend.forward(layer_id, q, k, v, self.batch)
