"""Megatron-style tensor-parallel linear layers (column-parallel, then row-parallel with one
all-reduce); with one rank both are the plain `nn.Linear` they subclass."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import SINGLE, TPGroup

SMALL_ROWS = 16  # kernels.small_gemm.MAX_ROWS (imported only where Triton is)


class Unfilled:
    """A layer whose parameters start empty: `models.weights` fills every one, so `nn`'s default
    initialisation would only cost time."""

    def reset_parameters(self) -> None:
        pass


class SmallBatch:
    """`linear`: `F.linear`, or for a few rows the small-batch Triton kernel when `small_gemm`
    is set (`Decoder.use_small_gemm`)."""

    small_gemm = False
    pdl = False  # the small-batch kernel launches with PDL (`Decoder.use_pdl`)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.small_gemm and 0 < x.shape[0] <= SMALL_ROWS:
            from ..kernels.small_gemm import small_linear

            return small_linear(x, self.weight, bias, pdl=self.pdl)
        return F.linear(x, self.weight, bias)


def split(total: int, tp: TPGroup, what: str) -> int:
    """One rank's share of `total` rows; refuses a split that leaves ranks unequal."""
    if total % tp.size:
        raise ValueError(f"{what}={total} is not divisible by tp_size={tp.size}")
    return total // tp.size


class ColumnParallelLinear(SmallBatch, Unfilled, nn.Linear):
    """Outputs made of parts (q | k | v, gate | up), each split evenly: rank r holds slice r."""

    def __init__(
        self,
        in_features: int,
        part_sizes: Sequence[int],
        bias: bool = False,
        tp: TPGroup = SINGLE,
    ) -> None:
        self.local_sizes = tuple(split(p, tp, "output part") for p in part_sizes)
        super().__init__(in_features, sum(self.local_sizes), bias=bias)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x, self.bias)

    @torch.no_grad()
    def load_shard(self, attr: str, full: torch.Tensor, part: int | None = None) -> None:
        """`full`: the one-rank weight or bias of part `part`, or of all parts stacked."""
        dst = getattr(self, attr)
        parts = range(len(self.local_sizes)) if part is None else (part,)
        for i in parts:
            n = self.local_sizes[i]
            local_start = sum(self.local_sizes[:i])
            # NOTE: the full layout stacks whole parts; each part is size * n rows long
            full_start = (self.tp.size * local_start if part is None else 0) + self.tp.rank * n
            dst[local_start : local_start + n].copy_(full[full_start : full_start + n])


class RowParallelLinear(SmallBatch, Unfilled, nn.Linear):
    """Inputs split over the ranks; one all-reduce sums the partial products, then bias is added."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, tp: TPGroup = SINGLE
    ) -> None:
        super().__init__(split(in_features, tp, "input size"), out_features, bias=bias)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.linear(x, self.bias)
        out = self.tp.all_reduce(self.linear(x, None))
        return out if self.bias is None else out + self.bias

    @torch.no_grad()
    def load_shard(self, attr: str, full: torch.Tensor, part: int | None = None) -> None:
        dst = getattr(self, attr)
        if attr == "bias":
            dst.copy_(full)
            return
        n = self.in_features
        dst.copy_(full[:, self.tp.rank * n : (self.tp.rank + 1) * n])
