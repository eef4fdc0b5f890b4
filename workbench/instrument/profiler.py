"""Per-step profiler capture (record="full"): torch.profiler around one scheduler step, its events
flattened to (name, category, track, start_us, duration_us) on the run's time axis."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable

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


class StepProfiler:
    """torch.profiler around one step. The collector is paused meanwhile: the profiler leaves
    thousands of event objects in reference cycles, and collections during the step would
    promote them to the old generation, where each full collection walks the whole heap (on the
    H200 machine 38 of them took 21 s of a 76 s run). Paused, they are still young when the
    profiler is dropped, and the next young collection frees them."""

    def __init__(self, clock: Callable[[], float], device: torch.device) -> None:
        from torch.profiler import profile

        self._clock, self._cuda = clock, device.type == "cuda"
        self._prof = profile(activities=activities(device))
        self._offset_us = 0.0
        self._events: tuple = ()
        self._gc_was_enabled = False

    def __enter__(self) -> StepProfiler:
        self._offset_us = self._clock() * 1e6
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            with _quiet_stderr():
                self._prof.__enter__()
        except BaseException:
            self._resume_gc()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._cuda:
                torch.cuda.synchronize()
            with _quiet_stderr():
                self._prof.__exit__(*exc)
            if exc[0] is None:
                self._events = self._flatten()
        finally:
            self._prof = None  # its events are garbage now, still in the young generation
            self._resume_gc()

    def _resume_gc(self) -> None:
        if self._gc_was_enabled:
            gc.enable()

    def events(self) -> tuple[tuple[str, str, str, float, float], ...]:
        """The step's events, flattened: (name, category, track, start_us, duration_us)."""
        return self._events

    def _flatten(self) -> tuple[tuple[str, str, str, float, float], ...]:
        out = []
        for e in self._prof.events():
            duration = e.time_range.end - e.time_range.start
            if duration <= 0:
                continue
            on_device = e.device_type == torch.autograd.DeviceType.CUDA
            category = "hook" if e.name in HOOK_POINTS else "kernel" if on_device else "cpu_op"
            if category == "cpu_op" and (duration < MIN_CPU_OP_US or e.name in _BOOKKEEPING):
                continue  # most host operators are views and casts of a few microseconds
            track = f"gpu:{e.device_index}:{e.thread}" if on_device else f"cpu:{e.thread}"
            out.append((e.name, category, track, self._offset_us + e.time_range.start, duration))
        return tuple(out)


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
