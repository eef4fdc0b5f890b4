"""Profiler capture (record="full"): one torch.profiler session over many steps, its events
flattened to (name, category, track, start_us, duration_us) on the run's time axis."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from .hooks import HOOK_POINTS

MIN_CPU_OP_US = 10.0  # host operators shorter than this are not kept (kernels and ranges are)
_BOOKKEEPING = {
    "aten::as_strided",
    "aten::view",
    "aten::transpose",
    "aten::slice",
    "aten::select",
    "aten::reshape",
    "aten::narrow",
    "aten::t",
    "aten::unsqueeze",
    "aten::resolve_conj",
    "aten::result_type",
    "aten::empty",
    "aten::empty_strided",
    "aten::expand",
    "aten::detach",
    "aten::lift_fresh",
    "aten::alias",
    "aten::_unsafe_view",
    "aten::permute",
    "aten::split",
}


def activities(device: torch.device) -> list:
    """What torch.profiler records on `device`: host operators, and kernels on a GPU."""
    from torch.profiler import ProfilerActivity

    cuda = [ProfilerActivity.CUDA] if device.type == "cuda" else []
    return [ProfilerActivity.CPU, *cuda]


class Event(NamedTuple):
    """One profiler event on the run's clock, and the host time that places it in a step: its
    own start for host events; for a kernel, the start of the host operator that launched it
    (with overlap a kernel may run while the host already prepares the next batch)."""

    name: str
    category: str  # "hook" (a hook point's range), "kernel" or "cpu_op"
    track: str  # "cpu:<thread>" or "gpu:<device>:<stream>"
    start_us: float
    duration_us: float
    placed_us: float


class ProfilerSession:
    """One torch.profiler (kineto) session over any number of steps (record="full").

    Nothing is read while it runs: no synchronisation and no Python object per event. `stop()`
    synchronises once and reads kineto's events once. A start and stop around every step
    instead cost a synchronisation and tens of milliseconds each, which a profiled run then
    measured as its own step times.

    On a GPU only ranges (the hook points' `record_function`) are recorded on the host, not
    every ATen operator: the kernels come from CUPTI, each linked to the range that launched it,
    and tracing thousands of operators a step would slow the host (the one that matters with
    overlap) several times over. On a CPU the operators are the kernels, so all are recorded.
    """

    def __init__(self, clock: Callable[[], float], device: torch.device) -> None:
        self._clock, self._cuda = clock, device.type == "cuda"
        self._activities = set(activities(device))
        self._results_of = None  # stops the session; gives kineto's results
        self._offset_us = 0.0

    @property
    def running(self) -> bool:
        return self._results_of is not None

    def start(self) -> None:
        from torch._C._profiler import RecordScope
        from torch.autograd import _disable_profiler, _enable_profiler, _prepare_profiler
        from torch.autograd.profiler import profile

        config = profile(use_kineto=True).config()  # this torch's defaults
        scopes = {RecordScope.USER_SCOPE} if self._cuda else set()
        with _quiet_stderr():
            _prepare_profiler(config, self._activities)
            _enable_profiler(config, self._activities, scopes)
        # NOTE: kineto's times are on the Unix clock; the records', on the run's clock.
        self._offset_us = self._clock() * 1e6 - time.time_ns() / 1e3
        self._results_of = _disable_profiler

    def stop(self) -> list[Event]:
        """End the session; its events, in the order kineto gives them."""
        disable, self._results_of = self._results_of, None
        if self._cuda:
            torch.cuda.synchronize()
        with _quiet_stderr():
            results = disable()
        return self._read(results)

    def discard(self) -> None:
        if self._results_of is not None:
            disable, self._results_of = self._results_of, None
            with _quiet_stderr():
                disable()

    def _read(self, results) -> list[Event]:
        offset, cuda = self._offset_us, torch.autograd.DeviceType.CUDA
        launched_at: dict[int, float] = {}  # host operator's correlation id -> its start
        kernels, out = [], []
        for e in results.events():
            duration = e.duration_ns() / 1e3
            start = e.start_ns() / 1e3 + offset
            if e.device_type() == cuda:
                name = e.name()
                # NOTE: a hook range shows on the device too (kineto's GPU annotation of the
                # kernels it launched); its host twin is kept
                if duration > 0 and name not in HOOK_POINTS:
                    track = f"gpu:{e.device_index()}:{e.device_resource_id()}"
                    kernels.append((name, track, start, duration, e.linked_correlation_id()))
                continue
            launched_at[e.correlation_id()] = start
            name = e.name()
            category = "hook" if name in HOOK_POINTS else "cpu_op"
            if duration <= 0 or (
                category == "cpu_op" and (duration < MIN_CPU_OP_US or name in _BOOKKEEPING)
            ):
                continue  # most host operators are views and casts of a few microseconds
            out.append(Event(name, category, f"cpu:{e.start_thread_id()}", start, duration, start))
        for name, track, start, duration, link in kernels:
            placed = launched_at.get(link, start)
            out.append(Event(name, "kernel", track, start, duration, placed))
        return out


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto prints a line to the process's stderr at every profiler start and stop (torch
    2.13), which a notebook shows under every step; silence file descriptor 2 meanwhile."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
