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


class AttentionBackend(ABC):
    """Paged attention over the token-granular page table.

    `prepare` runs once per batch, before the forward, and leaves what the kernels need in
    `batch.attn_metadata`; `forward` runs once per layer: it stores the new K/V at
    `out_loc(batch)` and attends each request's queries to its tokens ``[0, device_len)``.
    Given k and v as None, it takes them as stored already (by a fused kernel, at `out_loc`).
    """

    supports_cuda_graph = False  # True: has graph_metadata() and prepare_replay()

    def __init__(
        self,
        pool: KVPool,
        table: TableManager,
        num_heads: int,
        head_dim: int,
        decode_tensor_cores: bool | None = None,
    ) -> None:
        """`decode_tensor_cores`: decode attention on tensor cores (a backend that has the
        choice; None: the backend decides)."""
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
        """The batch prepared last is launched: everything its `prepare` enqueued lies before
        `timer`'s start (a backend that reuses host buffers knows when they are free)."""
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
