"""What a step's times mean, defined once so no two views disagree: ``device_ms`` is the forward
and sampling (on the CPU, their wall time on the host's cores), ``host_work_ms`` the host's own
work, ``host_bound`` own work longer than the device's, ``span_ms`` the step's share of the run
(spans add up to it) and ``idle_ms`` the span less the device's time (device busy: their ratio)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

DEVICE_MEANING = {
    True: "on the CPU the device's work is the forward and sampling, run on the host's cores",
    False: "the device's work is the forward and sampling on the GPU, between CUDA events",
}
DEVICE_STAGES = ("forward", "sample")


def host_work_ms(host_ms: float, device_ms: float, device_on_host: bool) -> float:
    if device_on_host:
        return max(host_ms - device_ms, 0.0)
    return host_ms


def is_host_bound(host_ms: float, device_ms: float, device_on_host: bool) -> bool:
    return host_work_ms(host_ms, device_ms, device_on_host) > device_ms


def add_timing_columns(steps: pd.DataFrame, device_on_host: bool) -> pd.DataFrame:
    """`steps` with the timing columns added in place (where an older saved run lacks them)."""
    import pandas as pd

    device = steps.device_ms.to_numpy(dtype=float)
    if "host_work_ms" not in steps:
        host = steps.host_ms.to_numpy(dtype=float) if "host_ms" in steps else np.nan + device
        work = np.maximum(host - device, 0.0) if device_on_host else host
        known = ~np.isnan(work)
        steps["host_work_ms"] = work
        steps["host_bound"] = pd.array(np.where(known, work > device, None), dtype="boolean")
    steps["span_ms"] = step_spans_ms(steps)
    steps["idle_ms"] = np.maximum(steps.span_ms.to_numpy(dtype=float) - device, 0.0)
    return steps


def step_spans_ms(steps: pd.DataFrame) -> np.ndarray:
    """Each step's span: from the previous completion (or its own launch, if later) to its own."""
    if steps.empty:
        return np.zeros(0)
    launched = steps.launched_at.to_numpy(dtype=float)
    completed = steps.completed_at.to_numpy(dtype=float)
    previous = np.concatenate([[-math.inf], np.maximum.accumulate(completed)[:-1]])
    return (completed - np.maximum(previous, launched)).clip(min=0) * 1e3


class RunTiming(NamedTuple):
    steps: int
    host_bound: int | None  # None: the run recorded no host times
    device_ms: float
    span_ms: float
    idle_ms: float
    device_on_host: bool

    @property
    def device_busy_pct(self) -> float:
        return 100 * self.device_ms / self.span_ms if self.span_ms > 0 else math.nan


def run_timing(steps: pd.DataFrame, device_on_host: bool) -> RunTiming:
    if "host_bound" not in steps or "span_ms" not in steps:
        steps = add_timing_columns(steps.copy(), device_on_host)
    known = steps.host_bound.notna()
    return RunTiming(
        steps=len(steps),
        host_bound=int(steps.host_bound[known].astype(bool).sum()) if known.any() else None,
        device_ms=float(steps.device_ms.sum()),
        span_ms=float(steps.span_ms.sum()),
        idle_ms=float(steps.idle_ms.sum()),
        device_on_host=device_on_host,
    )


def device_on_host(history) -> bool:
    """Whether the forward ran on the host's cores (a CPU engine; a twin's runs stand for a GPU)."""
    meta = getattr(history, "meta", {}) or {}
    if meta.get("simulated"):
        return False
    return str(meta.get("device", "")).startswith("cpu")
