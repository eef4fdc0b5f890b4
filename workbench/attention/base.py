"""The attention-backend interface and its registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ..registry import create

if TYPE_CHECKING:
    from ..core import Batch
    from ..device import DeviceTimer
    from ..kvcache.pool import KVPool
    from ..kvcache.table import TableManager


class GraphPlans(Protocol):
    """How a backend runs the padded graph shapes of `engine/graph.py` (`Shape`: tokens, rows,
    decode), each on its static device buffers `x` (host copies: `host`): FlashInfer's
    `GraphWrappers` (captured in CUDA graphs), the torch backend's `TorchGraphs` (run eagerly)."""

    capturable: bool  # whether a CUDA graph can capture its shapes

    def paged_lens(self, kv_lens: np.ndarray, indptr: np.ndarray, last_page_len: np.ndarray):
        """Fill the page `indptr` and last-page lengths for these KV lengths (host)."""

    def metadata(self, shape: Any, x: dict[str, torch.Tensor]) -> Any | None:
        """The shape's `batch.attn_metadata`, made once; None: it cannot run this prompt shape."""

    def plan(self, shape: Any, host: dict[str, np.ndarray]) -> None:
        """Plan the shape's attention for the step whose inputs are `host`, before it runs."""

    def graph_indices(self, shape: Any, rows: torch.Tensor, indptr: torch.Tensor) -> None:
        """Inside the step (and its graph): what `shape`'s attention reads of these rows' pages."""


class AttentionBackend(ABC):
    """Paged attention over the token-granular page table: `prepare` once per batch (its inputs
    into `batch.attn_metadata`), `forward` per layer (k and v None: a fused kernel stored them)."""

    graphs: GraphPlans | None = None  # None: it runs unpadded steps only
    # in words, the cores FlashInfer's decode kernel runs on, by batch size; None: another kernel
    decode_cores: str | None = None

    def __init__(
        self,
        pool: KVPool,
        table: TableManager,
        num_heads: int,
        head_dim: int,
        decode_tensor_cores: bool | None = None,
        decode_split_kv: bool = True,
        decode_kernel: str = "flashinfer",
        pdl: bool = False,
    ) -> None:
        """`decode_tensor_cores`: decode attention on tensor cores (None: the backend decides);
        `decode_split_kv`: a captured decode step may split a request's KV over programs;
        `decode_kernel`: "flashinfer" or "triton" (`kernels/decode_attention.py`); `pdl`: the
        Triton decode kernel launches with programmatic dependent launch (`kernels/pdl.py`). The
        last three are read by the FlashInfer backend; the torch backend has one kernel of its
        own."""
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


def paged_lens(
    kv_lens: np.ndarray, page_size: int, indptr: np.ndarray, last_page_len: np.ndarray
) -> None:
    """Fill each request's page `indptr` and last-page length for these KV lengths, in place."""
    indptr[0] = 0
    if page_size == 1:
        np.cumsum(kv_lens, out=indptr[1:])
        last_page_len[:] = 1
        return
    num_pages = -(-kv_lens // page_size)
    np.cumsum(num_pages, out=indptr[1:])
    last_page_len[:] = kv_lens - (num_pages - 1) * page_size
