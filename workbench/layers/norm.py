"""RMSNorm, optionally fused with the residual add before it. The torch path computes in float32
as Hugging Face does, so on the CPU its outputs match Hugging Face's bit for bit."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.fused = False  # set by Decoder.use_fused_kernels()

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``norm(x)``; or, given the residual stream, ``(norm(residual + x), residual + x)``."""
        if self.fused and x.numel() > 0:  # NOTE: FlashInfer's kernels fail on zero rows
            from flashinfer.norm import fused_add_rmsnorm, rmsnorm

            if residual is None:
                return rmsnorm(x.reshape(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)
            fused_add_rmsnorm(x, residual, self.weight, self.eps)  # in place: both updated
            return x, residual
        if residual is None:
            return self._norm(x)
        residual = residual + x
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)
