"""Roofline: what a step must at least cost on a device, from the sizes of the model and batch.

A forward reads every streamed weight once, reads each request's KV context and writes the KV of
its new tokens (memory); it does two FLOPs per weight per token computed, plus the attention
products (compute). It takes no less than the larger of bytes / bandwidth and FLOPs / peak.
`StepCost` applies this to any batch (prefill, chunk, decode, mixed) from its ledger rows; the
steps table carries the result of every step (`bytes_read`, `flops`, `bound_ms`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

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
        """`count` of these devices sharing a step evenly (tensor parallelism: each reads and
        computes 1/count of it, so the step's bound is 1/count of one device's)."""
        if count == 1:
            return self
        return DeviceSpec(f"{count} x {self.name}", self.bandwidth * count, self.flops * count)


H200 = DeviceSpec("H200", 4.8e12, 989e12)
H100 = DeviceSpec("H100", 3.35e12, 989e12)
DEVICES = {"h200": H200, "h100": H100}


def streamed_weights(model_cfg: ModelConfig) -> int:
    """Parameters read in full by one forward (the embedding is only gathered, unless tied)."""
    embed = model_cfg.vocab_size * model_cfg.hidden_size
    return model_cfg.num_params() - (0 if model_cfg.tie_word_embeddings else embed)


def attention_flops_per_pair(model_cfg: ModelConfig) -> int:
    """FLOPs of one (query token, key token) pair over all layers: QK^T and PV, 2 each."""
    return 4 * model_cfg.num_heads * model_cfg.head_dim * model_cfg.num_layers


def decode_step_bound(
    model_cfg: ModelConfig,
    batch_size: int,
    kv_tokens: int,
    device: DeviceSpec,
    dtype_bytes: int = 2,
) -> float:
    """Seconds for one decode step of `batch_size` requests whose attention reads `kv_tokens`
    tokens of KV in all (each request's context, its new token included); each writes the KV of
    its one new token."""
    weights = streamed_weights(model_cfg)
    kv_moved = kv_tokens + batch_size
    memory = weights * dtype_bytes + kv_moved * model_cfg.kv_bytes_per_token(dtype_bytes)
    compute = 2 * weights * batch_size + kv_tokens * attention_flops_per_pair(model_cfg)
    return max(memory / device.bandwidth, compute / device.flops)


def prefill_bound(model_cfg: ModelConfig, prompt_lens: list[int], device: DeviceSpec) -> float:
    """Seconds of the FLOPs of prefilling `prompt_lens` (the whole square of attention)."""
    weights = streamed_weights(model_cfg)
    tokens = sum(prompt_lens)
    attn = sum(
        2 * n * n * model_cfg.num_heads * model_cfg.head_dim * model_cfg.num_layers
        for n in prompt_lens
    )
    return (2 * weights * tokens + attn) / device.flops


def device_spec(device: torch.device | str) -> DeviceSpec | None:
    """The spec of a CUDA device whose name says H200 or H100; None on a CPU or another GPU."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return spec_named(torch.cuda.get_device_name(device))


def spec_named(name: str) -> DeviceSpec | None:
    """The spec of a GPU by its name ("NVIDIA H200"); None for a CPU or another GPU."""
    return next((spec for spec in (H200, H100) if spec.name in name.upper()), None)


class StepBound(NamedTuple):
    """What one step must at least cost: bytes moved, FLOPs, and the time on the device."""

    bytes_read: float  # weights once, the KV contexts read, the new tokens' KV written
    flops: float
    bound_ms: float  # max(bytes / bandwidth, FLOPs / peak); NaN without a device spec


@dataclass(frozen=True)
class StepCost:
    """The roofline of any step (prefill, chunk, decode, mixed) of one model on one device.

    Per step, over the requests of its batch (context = the tokens its attention reads, the new
    ones included; new = `extend_len`, the tokens the step computes for it):

    - bytes = weight_bytes + kv_bytes_per_token x sum(context + new);
    - FLOPs = flops_per_token x sum(new) + flops_per_pair x sum(new x (context - new + (new + 1)
      / 2)), the causal pairs: each new token attends to the tokens before it and to itself;
    - bound = max(bytes / bandwidth, FLOPs / peak).

    Padding rows of a CUDA-graph batch are not counted: the bound is of the useful work."""

    weight_bytes: int  # the streamed weights, read once per step
    kv_bytes_per_token: int  # K and V of one token over all layers
    flops_per_token: int  # 2 x the streamed weights: the matmuls of one token
    flops_per_pair: int  # attention of one (query, key) pair over all layers
    device: DeviceSpec | None  # None (a CPU, an unknown GPU): no time bound

    @classmethod
    def for_model(
        cls, model_cfg: ModelConfig, dtype_bytes: int, device: DeviceSpec | None = None
    ) -> StepCost:
        """The cost of the model's steps with weights and KV of `dtype_bytes` each, on
        `device`."""
        weights = streamed_weights(model_cfg)
        return cls(
            weight_bytes=weights * dtype_bytes,
            kv_bytes_per_token=model_cfg.kv_bytes_per_token(dtype_bytes),
            flops_per_token=2 * weights,
            flops_per_pair=attention_flops_per_pair(model_cfg),
            device=device,
        )

    @classmethod
    def for_engine(
        cls,
        model_config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device | str,
        num_devices: int = 1,
    ) -> StepCost:
        """The cost of an engine's steps: its model in its dtype, on its device's spec (times
        `num_devices` GPUs a tensor-parallel engine splits each step over)."""
        spec = device_spec(device)
        return cls.for_model(model_config, dtype.itemsize, spec and spec.times(num_devices))

    def of_step(self, rows: Iterable[LedgerRow]) -> StepBound:
        """The bound of a step from its ledger rows (a StepRecord's `rows`)."""
        kv_tokens = pairs = tokens = 0
        for r in rows:
            # NOTE: ledger rows hold the lengths after the step: the context the attention read
            # is `cached_len`, of which the last `extend_len` tokens are the ones computed.
            new = r.extend_len
            kv_tokens += r.cached_len + new
            pairs += new * (r.cached_len - new) + new * (new + 1) // 2
            tokens += new
        nbytes = self.weight_bytes + kv_tokens * self.kv_bytes_per_token
        flops = tokens * self.flops_per_token + pairs * self.flops_per_pair
        spec = self.device
        if spec is None:
            return StepBound(float(nbytes), float(flops), math.nan)
        seconds = max(nbytes / spec.bandwidth, flops / spec.flops)
        return StepBound(float(nbytes), float(flops), seconds * 1e3)


NO_COST = StepBound(math.nan, math.nan, math.nan)  # a history without a StepCost
