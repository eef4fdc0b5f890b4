"""Profiler capture (record="full"): one torch.profiler session over many steps, its events
flattened to (name, category, track, start_us, duration_us) on the run's time axis."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
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
    """One profiler event on the run's clock, with what ties it to a step: a host range or
    operator has its own correlation id (`corr`); a kernel or a CUDA runtime call links to the
    range or operator that launched it (`link`), whose step is its step. 0: none."""

    name: str
    category: str  # "hook" (a hook point's range), "kernel" or "cpu_op"
    track: str  # "cpu:<thread>" or "gpu:<device>:<stream>"
    start_us: float
    duration_us: float
    corr: int
    link: int


LAUNCH_RANGES = frozenset({"schedule.end", "batch.prepared", "forward.end"})
COLLECT_RANGES = frozenset({"sample.end", "step.end"})
SKEW_US = 20.0  # how far the profiler's clock and the run's may disagree


def assign_to_steps(
    events: list[Event], marks: list[tuple[float, int, str]]
) -> dict[int, list[tuple]]:
    """Each event's step. `marks` are where the steps' host work began on the run's clock:
    (seconds, step, "launch") when a batch's launch began (step -1: a launch that found
    nothing to run), (seconds, step, "collect") when its collect began. A hook range goes to
    the last mark of its kind before it (give or take the two clocks' skew); another host event
    to the last mark of any kind before it; a kernel or runtime call to the step of the range
    or operator that launched it. Returns step -> (name, category, track, start_us,
    duration_us) tuples."""
    by_kind = {kind: _marks([m for m in marks if m[2] == kind]) for kind in ("launch", "collect")}
    every = _marks(marks)
    step_of: dict[int, int] = {}
    placed: list[tuple[Event, int]] = []
    linked = []
    for e in events:
        if e.link:
            linked.append(e)
            continue
        mid = e.start_us + e.duration_us / 2
        if e.category == "hook" and (e.name in LAUNCH_RANGES or e.name in COLLECT_RANGES):
            kind = "launch" if e.name in LAUNCH_RANGES else "collect"
            step = _last_before(by_kind[kind], mid + SKEW_US)
        else:
            step = _last_before(every, mid)
        if step is not None:
            placed.append((e, step))
            if e.corr:
                step_of[e.corr] = step
    for e in linked:
        step = step_of.get(e.link)
        if step is None:
            step = _last_before(every, e.start_us + e.duration_us / 2)
        if step is not None:
            placed.append((e, step))
    out: dict[int, list[tuple]] = {}
    for e, step in placed:
        out.setdefault(step, []).append(e[:5])
    return out


def _marks(marks) -> tuple[np.ndarray, list[int]]:
    marks = sorted(marks)
    return np.array([m[0] for m in marks], dtype=np.float64) * 1e6, [m[1] for m in marks]


def _last_before(marks, t: float) -> int | None:
    times, steps = marks
    i = int(np.searchsorted(times, t, side="right")) - 1
    return steps[i] if i >= 0 else None


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
        out = []
        # NOTE: each accessor is a call into C++; a run leaves hundreds of thousands of events,
        # so the ones dropped (short host calls) are dropped after as few calls as possible
        for e in results.events():
            duration = e.duration_ns() / 1e3
            if duration <= 0:
                continue
            on_device = e.device_type() == cuda
            name = e.name()
            if on_device:
                # NOTE: a hook range shows on the device too (kineto's GPU annotation of the
                # kernels it launched); its host twin is kept
                if name in HOOK_POINTS:
                    continue
                category, track = "kernel", f"gpu:{e.device_index()}:{e.device_resource_id()}"
            else:
                category = "hook" if name in HOOK_POINTS else "cpu_op"
                if category == "cpu_op" and (duration < MIN_CPU_OP_US or name in _BOOKKEEPING):
                    continue  # most host operators are views and casts of a few microseconds
                track = f"cpu:{e.start_thread_id()}"
            link = e.linked_correlation_id()
            # NOTE: a CUDA runtime call (cudaLaunchKernel) links to a range or operator; its own
            # correlation id is CUPTI's, from another sequence that can collide with theirs
            corr = 0 if link or on_device else e.correlation_id()
            start = e.start_ns() / 1e3 + offset
            out.append(Event(name, category, track, start, duration, corr, link))
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
