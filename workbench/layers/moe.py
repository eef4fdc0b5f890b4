"""The sparse mixture-of-experts block: a router picks `top_k` experts per token, each a gated MLP.

One expert layout for every backend: `w13` [experts, 2 x intermediate, hidden] (gate rows, then
up rows) and `w2` [experts, hidden, intermediate], as Hugging Face keeps them in memory
(`experts.gate_up_proj`, `experts.down_proj`). Tensor-parallel: each rank holds a slice of every
expert's intermediate dimension (gate and up column-wise, down row-wise) and one all-reduce sums
the partial outputs, as the dense MLP's row-parallel down projection does. The router is
replicated. The expert computation is a backend from `MOE_BACKENDS`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import SINGLE, TPGroup
from .parallel import split

if TYPE_CHECKING:
    from ..attention.context import ForwardContext

# (x [tokens, hidden], w13, w2, topk_weights [tokens, top_k] in x's dtype, topk_ids [tokens,
# top_k]) -> [tokens, hidden] in x's dtype, before the tensor-parallel all-reduce
ExpertsFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]

# name -> "module:function", imported on first use (a GPU-only kernel costs nothing elsewhere);
# `EngineConfig.moe_backend` accepts these names and "auto"
MOE_BACKENDS = {
    "torch": "workbench.layers.moe:torch_experts",
    "triton": "workbench.kernels.fused_moe:fused_moe",
}


def experts_backend(name: str) -> ExpertsFn:
    """The expert computation registered under `name`."""
    if name not in MOE_BACKENDS:
        raise ValueError(f"unknown MoE backend {name!r}; expected one of {sorted(MOE_BACKENDS)}")
    module, fn = MOE_BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), fn)


def torch_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """The experts in plain torch, on any device, with no host sync (so a CUDA graph can hold
    it): no `nonzero`, `.item()` or mask indexing; every shape follows from the batch's, never
    from which experts were picked.

    Two exact forms, chosen by the batch's shape (fixed for a graph), never by its routing:
    - fewer picks than experts (decode of a few requests): each token's own experts' weights
      gathered and multiplied in a batch, so only picked experts are read (a copy of them).
    - otherwise (prefill, large batches): each expert over every token, weighted by a dense
      [tokens, experts] matrix that is zero outside each token's picks. It does experts /
      top_k times the picked experts' arithmetic, with one expert's activations in memory at a
      time; an expert a token did not pick adds an exact zero and the picked ones add in expert
      order, as Hugging Face's loop does, so float32 results agree with it.
    Right for tiny models, the CPU and a reference; on a GPU the Triton backend is the fast one."""
    tokens, top_k = topk_ids.shape
    if tokens * top_k < w13.shape[0]:
        gate_up = torch.matmul(w13[topk_ids], x[:, None, :, None]).squeeze(-1)
        gate, up = gate_up.chunk(2, dim=-1)
        out = torch.matmul(w2[topk_ids], (F.silu(gate) * up)[..., None]).squeeze(-1)
        return (out * topk_weights[..., None]).sum(dim=1)
    weights = x.new_zeros(tokens, w13.shape[0]).scatter_(1, topk_ids, topk_weights)
    y = torch.zeros_like(x)
    for e in range(w13.shape[0]):
        gate, up = F.linear(x, w13[e]).chunk(2, dim=-1)
        y += F.linear(F.silu(gate) * up, w2[e]) * weights[:, e, None]
    return y


class SparseMoE(nn.Module):
    """Router (softmax in float32, top-k, renormalised when `renormalize`) and the experts."""

    def __init__(
        self,
        moe_index: int,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        renormalize: bool,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        self.moe_index = moe_index  # this block's row in `ctx.routing`
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.intermediate_size = split(intermediate_size, tp, "moe_intermediate_size")
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)  # replicated on every rank
        local = self.intermediate_size
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * local, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, local))
        self.tp = tp
        self.backend = "torch"  # set by Decoder.use_moe_backend()
        self.experts: ExpertsFn = torch_experts

    def use_backend(self, name: str) -> None:
        self.experts, self.backend = experts_backend(name), name

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's experts and their weights (in x's dtype), as Hugging Face computes them."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        topk_weights, topk_ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
        return topk_weights.to(x.dtype), topk_ids

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if self.backend == "triton" and x.shape[0] > 0:
            y = self._fused(x, ctx)
        else:
            topk_weights, topk_ids = self.route(x)
            ctx.route(self.moe_index, topk_ids)
            y = self.experts(x, self.w13, self.w2, topk_weights, topk_ids)
        return y if self.tp.size == 1 else self.tp.all_reduce(y)

    def _fused(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """The routing, its count in the record and its sort into blocks in two launches
        (`kernels/moe_route.py`), then the fused experts on those blocks."""
        from ..kernels.fused_moe import choose_blocks, fused_moe
        from ..kernels.moe_route import route_and_align

        blocks = choose_blocks(x.shape[0] * self.top_k, self.num_experts)
        routing = None if ctx.routing is None else ctx.routing[self.moe_index]
        logits = self.gate(x)
        weights, ids, *aligned = route_and_align(
            logits, self.top_k, self.renormalize, x.dtype, blocks.block_m, routing, ctx.counted
        )
        return fused_moe(x, self.w13, self.w2, weights, ids, blocks=blocks, aligned=aligned)

    @torch.no_grad()
    def load_shard(self, attr: str, full: torch.Tensor, part: int | None = None) -> None:
        """`full`: the one-rank tensor, all experts stacked ([experts, 2 x inter, hidden] for
        w13, [experts, hidden, inter] for w2), or one expert's part: `part` 2e (gate) or 2e + 1
        (up) of w13 ([inter, hidden]), e of w2 ([hidden, inter])."""
        if attr == "w13":
            n, lo = self.intermediate_size, self.tp.rank * self.intermediate_size
            if part is None:  # gate then up, each cut to this rank's rows
                inter = full.shape[1] // 2
                self.w13[:, :n].copy_(full[:, lo : lo + n])
                self.w13[:, n:].copy_(full[:, inter + lo : inter + lo + n])
            else:
                expert, which = divmod(part, 2)
                self.w13[expert, which * n : (which + 1) * n].copy_(full[lo : lo + n])
        elif attr == "w2":
            n, lo = self.intermediate_size, self.tp.rank * self.intermediate_size
            dst = self.w2 if part is None else self.w2[part]
            dst.copy_(full[..., lo : lo + n])
        else:
            raise ValueError(f"SparseMoE has no parameter {attr!r} to shard")
