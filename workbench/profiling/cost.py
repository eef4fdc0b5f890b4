"""What the profiler costs the host per event it records, measured once per process and device
when the first session starts there (`ProfilerSession.start`): a profiled step's own distortion
is its recorded host events times that (`StepEvents.profiler_ms`)."""

from __future__ import annotations

import contextlib
import math
import time

import torch

# device type -> host microseconds the profiler adds to each host event it records, measured
# once per process when the first session starts there (`ProfilerSession.start`)
_EVENT_COST_US: dict[str, float] = {}


def event_cost_us(device: torch.device) -> float:
    """What the profiler adds to the host per event it records on `device` (NaN before a session
    started there): the difference, per call, of the fastest of seven rounds of 200 calls that
    each record one event (a one-element add: an operator on the CPU; on a GPU, where only
    CUDA runtime calls and ranges are recorded on the host, its kernel launch), with and
    without the profiler. An estimate: the events a step records differ from that call."""
    return _EVENT_COST_US.get(device.type, math.nan)


def _call_us(device: torch.device, calls: int = 200, rounds: int = 7) -> float:
    """Host microseconds per call of a one-element add on `device`, the fastest of `rounds`.

    Seven: with three, a busy host (tests on both cores) once made the unprofiled rounds the
    slower ones and the estimate 0."""
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
    """Around the enabling of a session's profiler: the first time on this device type,
    measures the call before and after it (`event_cost_us`). The calls' events come before the
    session's first step, so they belong to none."""
    if device.type in _EVENT_COST_US:
        yield
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    unprofiled = _call_us(device)
    yield
    _EVENT_COST_US[device.type] = max(0.0, _call_us(device) - unprofiled)
