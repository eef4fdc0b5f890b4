"""The attention-backend interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from ..registry import create

if TYPE_CHECKING:
    from ..core import Batch
    from ..device import DeviceTimer
    from ..kvcache.pool import KVPool
    from ..kvcache.table import TableManager
    from .flashinfer_graphs import GraphWrappers


class AttentionBackend(ABC):
    """Paged attention over the token-granular page table: `prepare` once per batch (its inputs
    into `batch.attn_metadata`), `forward` per layer (k and v None: a fused kernel stored them)."""

    graphs: GraphWrappers | None = None  # its CUDA-graph wrappers (None: it runs eagerly only)

    def __init__(
        self,
        pool: KVPool,
        table: TableManager,
        num_heads: int,
        head_dim: int,
        decode_tensor_cores: bool | None = None,
    ) -> None:
        """`decode_tensor_cores`: decode attention on tensor cores (None: the backend decides)."""
        self.pool, self.table = pool, table
        self.decode_tensor_cores = decode_tensor_cores
        self.num_heads, self.head_dim = num_heads, head_dim

    @abstractmethod
    def prepare(self, batch: Batch) -> None: ...

    @abstractmethod
    def forward(
        self,
        layer_id: int,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        batch: Batch,
    ) -> torch.Tensor:
        """q [tokens, heads, dim], k and v [tokens, kv_heads, dim] -> [tokens, heads, dim]."""

    def launched(self, timer: DeviceTimer) -> None:
        """The batch prepared last is launched: its `prepare`'s work precedes `timer`'s start."""
        return None

    def out_loc(self, batch: Batch) -> torch.Tensor:
        """The pool slot of each token of the batch, where its K and V go."""
        return batch.out_loc


# name -> "module:Class", imported on first use (flashinfer only exists on GPU machines)
BACKENDS = {
    "torch": "workbench.attention.torch_backend:TorchBackend",
    "flashinfer": "workbench.attention.flashinfer_backend:FlashInferBackend",
}


def create_backend(name: str, **kwargs) -> AttentionBackend:
    return create(BACKENDS, "attention backend", name, **kwargs)
