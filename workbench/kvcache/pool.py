"""The KV pool: one K and one V buffer per layer, addressed by token slot."""

from __future__ import annotations

import math

import numpy as np
import torch


class KVPool:
    """``num_pages * page_size`` token slots, and a last page never handed out: padding's."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self.num_slots = (num_pages + 1) * page_size
        self.dummy_slot = num_pages * page_size
        shape = (2, num_layers, self.num_slots, num_kv_heads, head_dim)
        self.buffer = _zeros(shape, dtype, torch.device(device))

    def k(self, layer: int) -> torch.Tensor:
        return self.buffer[0, layer]

    def v(self, layer: int) -> torch.Tensor:
        return self.buffer[1, layer]

    def store(self, layer: int, out_loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.buffer[0, layer].index_copy_(0, out_loc, k)
        self.buffer[1, layer].index_copy_(0, out_loc, v)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # NOTE: on the CPU lazily zeroed, so a large pool that a run barely uses costs no time or memory
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
