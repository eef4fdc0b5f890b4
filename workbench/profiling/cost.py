"""The profiler's host cost per recorded event, measured at the first session per device type."""

from __future__ import annotations

import contextlib
import math
import time

import torch

_EVENT_COST_US: dict[str, float] = {}


def event_cost_us(device: torch.device) -> float:
    """Host microseconds the profiler adds per event on `device` (NaN before a session there)."""
    return _EVENT_COST_US.get(device.type, math.nan)


def _call_us(device: torch.device, calls: int = 200, rounds: int = 15) -> float:
    x = torch.zeros(1, device=device)
    best = math.inf
    for _ in range(rounds):
        began = time.perf_counter_ns()
        for _ in range(calls):
            x.add_(1)
        best = min(best, time.perf_counter_ns() - began)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return best / calls / 1e3


@contextlib.contextmanager
def measure_event_cost(device: torch.device):
    """Around enabling the profiler: time an add before and after, once per device type (again
    at the next session where it came out 0 or less)."""
    if device.type in _EVENT_COST_US:
        yield
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    # NOTE: warmed first, then the least of 15 rounds: one make test on a busy 2-core machine read
    # the cost as 0 with 7 rounds unwarmed (2026-12-07)
    _call_us(device, rounds=2)
    unprofiled = _call_us(device)
    yield
    cost = _call_us(device) - unprofiled
    # NOTE: an operator recorded always costs something, yet a busy machine has read 0 (its speed
    # differed between the two timings; docs/performance.md): such a reading is no measurement
    if cost > 0:
        _EVENT_COST_US[device.type] = cost
