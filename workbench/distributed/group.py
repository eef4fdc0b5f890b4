"""This process's place in a tensor-parallel group, and the two collectives the layers use."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class TPGroup:
    """Rank `rank` of `size` processes that each hold 1/size of every layer (`group`: None if 1)."""

    rank: int
    size: int
    group: Any = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"TP rank {self.rank} outside [0, {self.size})")
        if (self.size > 1) != (self.group is not None):
            raise ValueError(f"a TP group of size {self.size} needs a process group iff size > 1")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place."""
        if self.size == 1:
            return x
        # NOTE: plain and synchronous on the current stream, so NCCL records it into a CUDA graph
        dist.all_reduce(x, group=self.group)
        return x

    def min_int(self, value: int, device: torch.device) -> int:
        """The least of the ranks' `value`s (what every rank can afford, e.g. KV pages)."""
        if self.size == 1:
            return value
        x = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(x, op=dist.ReduceOp.MIN, group=self.group)
        return int(x.item())

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.size == 1:
            return x
        # NOTE: gathered along dim 0 (gloo refuses the stacked form), then moved to `dim`
        out = x.new_empty((self.size * x.shape[0], *x.shape[1:]))
        _all_gather(out, x.contiguous(), group=self.group)
        d = dim % x.dim()
        return out.view(self.size, *x.shape).movedim(0, d).flatten(d, d + 1)


SINGLE = TPGroup(rank=0, size=1, group=None)


def init_tp(
    rank: int,
    size: int,
    backend: str | None = None,
    init_method: str = "env://",
    timeout: timedelta = timedelta(minutes=5),
    device: torch.device | None = None,
) -> TPGroup:
    """Join a TP group (`timeout`: a dead peer raises instead of hanging). NOTE: NCCL binds
    `device` at once, so the communicator exists before any CUDA graph capture."""
    if size == 1:
        return SINGLE
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    extra = {}
    if backend == "nccl":
        device = device or torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        extra["device_id"] = device
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=size, timeout=timeout, **extra
    )
    return TPGroup(rank=rank, size=size, group=dist.group.WORLD)


def close_tp(tp: TPGroup) -> None:
    if tp.group is not None:
        dist.destroy_process_group()
