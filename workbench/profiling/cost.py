"""What the profiler costs the host per event it records, measured at a process's first session
on each device type: a profiled step's own distortion is its host events times that."""

from __future__ import annotations

import contextlib
import math
import time

import torch

_EVENT_COST_US: dict[str, float] = {}


def event_cost_us(device: torch.device) -> float:
    """Host microseconds the profiler adds per event it records on `device` (NaN before a session
    started there): an estimate from a one-element add timed with and without the profiler."""
    return _EVENT_COST_US.get(device.type, math.nan)


def _call_us(device: torch.device, calls: int = 200, rounds: int = 7) -> float:
    """Host microseconds per call of a one-element add, the fastest of `rounds` (with few rounds,
    a busy host can make the unprofiled ones the slower)."""
    x = torch.zeros(1, device=device)
    best = math.inf
    for _ in range(rounds):
        began = time.perf_counter_ns()
        for _ in range(calls):
            x.add_(1)
        best = min(best, time.perf_counter_ns() - began)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # its kernels end before the session's first step
    return best / calls / 1e3


@contextlib.contextmanager
def measure_event_cost(device: torch.device):
    """Around the enabling of a session's profiler: the first time on this device type, time the
    call before and after it; those events precede the session's first step, so count in none."""
    if device.type in _EVENT_COST_US:
        yield
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    unprofiled = _call_us(device)
    yield
    _EVENT_COST_US[device.type] = max(0.0, _call_us(device) - unprofiled)
