"""Roofline: what a step must at least cost on a device. A forward reads every streamed weight
once and each request's KV, writes its new tokens' KV, and does two FLOPs per weight per token
plus the attention products; it takes no less than max(bytes / bandwidth, FLOPs / peak).

An MoE model's step reads its dense weights (attention, dense MLPs, router, norms, the LM head)
and, in each MoE layer, only the experts its tokens were routed to: the step's routing says
which (`routing.py`); each token computes its top-k experts, not all of them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .routing import expected_touched

if TYPE_CHECKING:
    import torch

    from ..models.config import ModelConfig
    from .record import LedgerRow


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bandwidth: float  # bytes/s
    flops: float  # dense FLOP/s in the model's dtype

    def times(self, count: int) -> DeviceSpec:
        """`count` of these devices sharing a step evenly (tensor parallelism)."""
        if count == 1:
            return self
        return DeviceSpec(f"{count} x {self.name}", self.bandwidth * count, self.flops * count)


H200 = DeviceSpec("H200", 4.8e12, 989e12)
H100 = DeviceSpec("H100", 3.35e12, 989e12)
DEVICES = {"h200": H200, "h100": H100}


def streamed_weights(model_cfg: ModelConfig) -> int:
    """Parameters one forward reads in full (the embedding is only gathered, unless tied)."""
    embed = model_cfg.vocab_size * model_cfg.hidden_size
    return model_cfg.num_params() - (0 if model_cfg.tie_word_embeddings else embed)


def expert_weights(model_cfg: ModelConfig) -> int:
    """Parameters of every expert of every MoE layer (0: a dense model)."""
    if not model_cfg.is_moe:
        return 0
    return len(model_cfg.moe_layers) * model_cfg.num_experts * model_cfg.expert_params()


def attention_flops_per_pair(model_cfg: ModelConfig) -> int:
    """FLOPs of one (query token, key token) pair over all layers: QK^T and PV, 2 each."""
    return 4 * model_cfg.num_heads * model_cfg.head_dim * model_cfg.num_layers


def decode_step_bound(
    model_cfg: ModelConfig,
    batch_size: int,
    kv_tokens: int,
    device: DeviceSpec,
    dtype_bytes: int = 2,
    experts: RoutedExperts | None = None,
) -> float:
    """Seconds for one decode step of `batch_size` requests whose attention reads `kv_tokens` of
    KV in all (new tokens included); each writes its new token's KV. An MoE model's step reads
    the `experts` its routing touched (`routed_experts` of a step's record); without them, those
    its tokens touch when routed uniformly at random (`Roofline.uniform_experts`)."""
    roofline = Roofline.for_model(model_cfg, dtype_bytes, device)
    if experts is None and roofline.expert_params:
        experts = roofline.uniform_experts(batch_size)
    # the same step as a table's row: its new tokens' KV read once and written once
    bound = roofline.of_counts(kv_tokens + batch_size, kv_tokens, batch_size, experts)
    return max(bound.bytes_read / device.bandwidth, bound.flops / device.flops)


def prefill_bound(model_cfg: ModelConfig, prompt_lens: list[int], device: DeviceSpec) -> float:
    """Seconds of the FLOPs of prefilling `prompt_lens` (the whole square of attention), counted
    as `Roofline.of_counts` counts a prompt step's: an MoE model's tokens each compute their
    top-k experts, not all of them."""
    roof = Roofline.for_model(model_cfg, 2, device)
    return sum(roof.of_counts(n, n * (n + 1) // 2, n).flops for n in prompt_lens) / device.flops


def device_spec(device: torch.device | str) -> DeviceSpec | None:
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return spec_named(torch.cuda.get_device_name(device))


def spec_named(name: str) -> DeviceSpec | None:
    return next((spec for spec in (H200, H100) if spec.name in name.upper()), None)


def roofline_spec(device, chosen: str | None = None, devices: int = 1) -> DeviceSpec | None:
    """The device a GPU run's roofline is drawn for: `chosen` (a key of `DEVICES`), else the GPU
    it ran on, by its name; over `devices` GPUs. None on a CPU, or on a GPU of neither name
    (another GPU's bound would say nothing true of this one)."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    spec = DEVICES[chosen] if chosen else device_spec(device)
    return None if spec is None else spec.times(devices)


class StepBound(NamedTuple):
    bytes_read: float
    flops: float
    bound_ms: float  # NaN without a device spec


@dataclass(frozen=True)
class Roofline:
    """The roofline of any step of one model on one device; padding rows are not counted."""

    weight_bytes: int  # the streamed weights read once per step (an MoE's: all but its experts)
    kv_bytes_per_token: int
    flops_per_token: int  # of those weights
    flops_per_pair: int
    device: DeviceSpec | None  # None (a CPU, an unknown GPU): no time bound
    expert_params: int = 0  # one expert of one MoE layer (0: a dense model)
    expert_bytes: int = 0  # its weights' bytes
    moe_layers: int = 0
    experts: int = 0  # per MoE layer
    top_k: int = 0  # experts per token

    @classmethod
    def for_model(
        cls, model_cfg: ModelConfig, dtype_bytes: int, device: DeviceSpec | None = None
    ) -> Roofline:
        dense = streamed_weights(model_cfg) - expert_weights(model_cfg)
        moe = {}
        if model_cfg.is_moe:
            moe = dict(
                expert_params=model_cfg.expert_params(),
                expert_bytes=model_cfg.expert_params() * dtype_bytes,
                moe_layers=len(model_cfg.moe_layers),
                experts=model_cfg.num_experts,
                top_k=model_cfg.num_experts_per_tok,
            )
        return cls(
            weight_bytes=dense * dtype_bytes,
            kv_bytes_per_token=model_cfg.kv_bytes_per_token(dtype_bytes),
            flops_per_token=2 * dense,
            flops_per_pair=attention_flops_per_pair(model_cfg),
            device=device,
            **moe,
        )

    @classmethod
    def for_engine(
        cls,
        model_config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        num_devices: int = 1,
    ) -> Roofline:
        spec = device_spec(device)
        return cls.for_model(model_config, dtype.itemsize, spec and spec.times(num_devices))

    def of_step(self, rows: Iterable[LedgerRow], routing: np.ndarray | None = None) -> StepBound:
        """The step of ledger `rows`; an MoE model's reads the experts its `routing` (int32 [MoE
        layers, experts], `StepRecord.routing`) touched, or all of them when it is not known."""
        kv_tokens = pairs = tokens = 0
        for r in rows:
            # NOTE: lengths are after the step: the last `extend_len` of `cached_len` are new
            new = r.extend_len
            kv_tokens += r.cached_len + new
            pairs += new * (r.cached_len - new) + new * (new + 1) // 2
            tokens += new
        return self.of_counts(kv_tokens, pairs, tokens, routed_experts(routing))

    def of_counts(
        self, kv_tokens: int, pairs: int, tokens: int, experts: RoutedExperts | None = None
    ) -> StepBound:
        """A step that moves `kv_tokens` of KV (read and written) and computes `pairs` (query,
        key) pairs of attention for `tokens` new tokens; an MoE model's reads the `experts` its
        routing touched (None: all of them, each token computing its top-k)."""
        nbytes = self.weight_bytes + kv_tokens * self.kv_bytes_per_token
        flops = tokens * self.flops_per_token + pairs * self.flops_per_pair
        if self.expert_params:
            if experts is None:
                experts = RoutedExperts(
                    self.moe_layers * self.experts, self.moe_layers * tokens * self.top_k
                )
            nbytes += experts.touched * self.expert_bytes
            flops += experts.routed * 2 * self.expert_params
        spec = self.device
        if spec is None:
            return StepBound(float(nbytes), float(flops), math.nan)
        seconds = max(nbytes / spec.bandwidth, flops / spec.flops)
        return StepBound(float(nbytes), float(flops), seconds * 1e3)

    def uniform_experts(self, tokens: int) -> RoutedExperts:
        """The experts `tokens` tokens touch routed uniformly at random, on average (for a bound
        where no routing was recorded: a skewed router touches fewer)."""
        touched = self.moe_layers * expected_touched(tokens, self.experts, self.top_k)
        return RoutedExperts(touched, self.moe_layers * tokens * self.top_k)


class RoutedExperts(NamedTuple):
    """Summed over an MoE model's MoE layers: the experts a step touched (whose weights it
    reads) and its (token, expert) choices (what those experts compute)."""

    touched: float
    routed: int


def routed_experts(routing: np.ndarray | None) -> RoutedExperts | None:
    """A step's routing counts (int32 [MoE layers, experts]) summed (None: not known)."""
    if routing is None:
        return None
    return RoutedExperts(int(np.count_nonzero(routing)), int(routing.sum()))


NO_BOUND = StepBound(math.nan, math.nan, math.nan)  # a history without a Roofline
