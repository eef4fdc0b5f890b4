"""Roofline of a whole offline workload: its prefill (its FLOPs), then every decode step at its
bound (reading every weight and active KV once, or its FLOPs: `history/roofline.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

# the per-step math lives with the steps table; these names are imported from here too
from ..history.roofline import (  # noqa: F401
    DEVICES,
    H100,
    H200,
    DeviceSpec,
    decode_step_bound,
    prefill_bound,
)

if TYPE_CHECKING:
    from ..models.config import ModelConfig


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
    model_cfg: ModelConfig,
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
    prefill = prefill_bound(model_cfg, prompt_lens, device)
    decode, steps = 0.0, 0
    cap = max_batch or len(pending)
    active = [[p, o - 1] for p, o in pending[:cap]]  # [context, decode steps left]
    queue = [[p, o - 1] for p, o in pending[cap:]]
    while active:
        running = [a for a in active if a[1] > 0]
        if running:
            kv = sum(a[0] for a in running)
            decode += decode_step_bound(model_cfg, len(running), kv, device, dtype_bytes)
            steps += 1
            for a in running:
                a[0] += 1
                a[1] -= 1
        active = [a for a in active if a[1] > 0]
        while queue and len(active) < cap:
            active.append(queue.pop(0))
    return WorkloadBound(prefill + decode, prefill, decode, steps, sum(output_lens))
