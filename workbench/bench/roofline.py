"""Roofline: lower bounds on decode step time and on a whole offline workload.

A decode step must at least read every weight once and every active request's KV cache once
(memory-bound), and do two FLOPs per weight per token plus the attention products
(compute-bound); it takes no less than the larger of the two. Prefill is bounded by its FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.config import ModelConfig


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bandwidth: float  # bytes/s
    flops: float  # dense FLOP/s in the model's dtype


H200 = DeviceSpec("H200", 4.8e12, 989e12)
DEVICES = {"h200": H200, "h100": DeviceSpec("H100", 3.35e12, 989e12)}


def _streamed_weights(cfg: ModelConfig) -> int:
    """Parameters read in full by one forward (the embedding is only gathered, unless tied)."""
    embed = cfg.vocab_size * cfg.hidden_size
    return cfg.num_params() - (0 if cfg.tie_word_embeddings else embed)


def decode_step_bound(
    cfg: ModelConfig, batch_size: int, kv_tokens: int, device: DeviceSpec, dtype_bytes: int = 2
) -> float:
    """Seconds for one decode step of `batch_size` requests reading `kv_tokens` tokens of KV."""
    weights = _streamed_weights(cfg)
    memory = weights * dtype_bytes + kv_tokens * cfg.kv_bytes_per_token(dtype_bytes)
    attn_flops = 4 * kv_tokens * cfg.num_heads * cfg.head_dim * cfg.num_layers
    compute = 2 * weights * batch_size + attn_flops
    return max(memory / device.bandwidth, compute / device.flops)


def prefill_bound(cfg: ModelConfig, prompt_lens: list[int], device: DeviceSpec) -> float:
    weights = _streamed_weights(cfg)
    tokens = sum(prompt_lens)
    attn = sum(2 * n * n * cfg.num_heads * cfg.head_dim * cfg.num_layers for n in prompt_lens)
    return (2 * weights * tokens + attn) / device.flops


@dataclass(frozen=True)
class WorkloadBound:
    seconds: float
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int
    output_tokens: int

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds


def workload_bound(
    cfg: ModelConfig,
    prompt_lens: list[int],
    output_lens: list[int],
    device: DeviceSpec,
    dtype_bytes: int = 2,
    max_batch: int | None = None,
) -> WorkloadBound:
    """All requests decode together from the start (the best case when they fit at once): at
    step t the requests with more than t tokens left run, each reading prompt + t tokens of KV.
    With `max_batch`, at most that many run per step (the rest follow in arrival order)."""
    pending = list(zip(prompt_lens, output_lens))
    prefill = prefill_bound(cfg, prompt_lens, device)
    decode, steps = 0.0, 0
    cap = max_batch or len(pending)
    active = [[p, o - 1] for p, o in pending[:cap]]  # [context, decode steps left]
    queue = [[p, o - 1] for p, o in pending[cap:]]
    while active:
        running = [a for a in active if a[1] > 0]
        if running:
            kv = sum(a[0] for a in running)
            decode += decode_step_bound(cfg, len(running), kv, device, dtype_bytes)
            steps += 1
            for a in running:
                a[0] += 1
                a[1] -= 1
        active = [a for a in active if a[1] > 0]
        while queue and len(active) < cap:
            active.append(queue.pop(0))
    return WorkloadBound(prefill + decode, prefill, decode, steps, sum(output_lens))
