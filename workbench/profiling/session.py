"""The profiler session of record="full": one torch.profiler (kineto) session over many steps,
started and stopped by rank 0's probe and by every tensor-parallel rank above 0."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from collections.abc import Callable

import torch

from .cost import measure_event_cost
from .events import Capture, read_events


def activities(device: torch.device) -> list:
    """What torch.profiler records on `device`: host operators, and kernels on a GPU. Every
    profiler this package starts asks for them; on a GPU, CUPTI is then let go when it stops
    (`release_cupti_at_stop`)."""
    from torch.profiler import ProfilerActivity

    if device.type != "cuda":
        return [ProfilerActivity.CPU]
    release_cupti_at_stop()
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def release_cupti_at_stop() -> None:
    """Have kineto tear CUPTI down when a profiler stops (`TEARDOWN_CUPTI=1`, unless the
    environment says otherwise), so that the steps after a profiled window run unprofiled. Set
    by every GPU engine when it is built (for profilers a user starts around it) and before
    every profiler this package starts.

    NOTE: torch 2.11's kineto keeps CUPTI's callbacks subscribed after a session by default, and
    every later CUDA call pays for them. Measured on the H200 (dummy Qwen3-0.6B, decode steps,
    overlap, record off, after one 5-step profiler session): a decode graph's launch 120-215 us
    against 10-15, the host's time per step 0.85 / 1.18 ms at batch 8 / 256 against 0.25 / 0.43.
    Set in the process before its first profiler starts, it took effect there. With CUDA 13
    there, CUPTI comes back for each window with CUDA graphs replaying (test_profiling's windows
    on the H200); before CUDA 12.6 that crashed, which is why kineto kept it by default."""
    os.environ.setdefault("TEARDOWN_CUPTI", "1")


class ProfilerSession:
    """One torch.profiler (kineto) session over any number of steps (record="full").

    Nothing is read while it runs: no synchronisation and no Python object per event. `stop()`
    synchronises once and hands back the reader of kineto's events (`read_events`). A start
    and stop around every step instead cost a synchronisation and tens of milliseconds each,
    which a profiled run then measured as its own step times.

    `ranges`: the names of our own `record_function` ranges (the hook points', a rank's step):
    category "hook" on the host, and their device-side twins dropped.

    On a GPU only ranges (the hook points' `record_function`) are recorded on the host, not
    every ATen operator: the kernels come from CUPTI, each linked to the range that launched it,
    and tracing thousands of operators a step would slow the host (the one that matters with
    overlap) several times over. On a CPU the operators are the kernels, so all are recorded.
    """

    def __init__(
        self, clock: Callable[[], float], device: torch.device, ranges: frozenset[str] = frozenset()
    ) -> None:
        self._clock, self._cuda, self._ranges = clock, device.type == "cuda", ranges
        self._device = device
        self._activities = set(activities(device))
        self._results_of = None  # stops the session; gives kineto's results
        self._offset_us = 0.0
        self.start_ms = 0.0  # what its last start took (on a GPU: CUPTI brought back each time)

    @property
    def running(self) -> bool:
        return self._results_of is not None

    def start(self) -> None:
        from torch._C._profiler import RecordScope
        from torch.autograd import _disable_profiler, _enable_profiler, _prepare_profiler
        from torch.autograd.profiler import profile

        began = time.perf_counter()
        config = profile(use_kineto=True).config()  # this torch's defaults
        scopes = {RecordScope.USER_SCOPE} if self._cuda else set()
        with measure_event_cost(self._device), _quiet_stderr():
            _prepare_profiler(config, self._activities)
            _enable_profiler(config, self._activities, scopes)
        self._offset_us = clock_offset_us(self._clock)
        self._results_of = _disable_profiler
        _RUNNING.add(self)
        seconds = time.perf_counter() - began
        self.start_ms, _SECONDS["start"] = seconds * 1e3, _SECONDS["start"] + seconds

    def stop(self) -> Callable[[], Capture]:
        """End the session. Returns what reads its events, in the order kineto gives them:
        reading a long run's (hundreds of thousands of kernels, a few microseconds of Python
        each) is left until someone looks."""
        disable, self._results_of = self._results_of, None
        _RUNNING.discard(self)
        if self._cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        with _quiet_stderr():
            results = disable()
        _SECONDS["stop"] += time.perf_counter() - began
        return functools.partial(read_events, results, self._offset_us, self._ranges)

    def discard(self) -> None:
        if self._results_of is not None:
            disable, self._results_of = self._results_of, None
            _RUNNING.discard(self)
            with _quiet_stderr():
                disable()


def clock_offset_us(clock: Callable[[], float], tries: int = 7) -> float:
    """The run's clock (`clock`, seconds) less the Unix clock (kineto's), in microseconds.

    Read as the run's clock between two Unix readings, from the try whose two readings were
    closest: a process preempted between two single readings (a loaded 2-core machine) would
    otherwise shift every event of the session by the pause, and a hook range would land on
    the step before its own."""
    best = None
    for _ in range(tries):
        before = time.time_ns()
        ours = clock()
        after = time.time_ns()
        if best is None or after - before < best[0]:
            best = (after - before, ours * 1e6 - (before + after) / 2e3)
    return best[1]


# NOTE: kineto is one profiler per process, so "a session runs" is a fact of the process: rank 0's
# engine reads it at each launch to tell the other ranks whether to profile the step too
_RUNNING: set[ProfilerSession] = set()


# host seconds this process spent starting sessions and stopping them (kineto's own processing
# of what it recorded), in all: `session_seconds`
_SECONDS = {"start": 0.0, "stop": 0.0}


def session_seconds() -> dict[str, float]:
    """Host seconds spent so far in this process starting profiler sessions ("start") and
    stopping them ("stop": kineto gathering what it recorded, before any event is read)."""
    return dict(_SECONDS)


def session_running() -> bool:
    """Whether a `ProfilerSession` records in this process now."""
    return bool(_RUNNING)


@contextlib.contextmanager
def gc_paused():
    """No garbage collection meanwhile: reading a session makes hundreds of thousands of small
    tuples, each allocation counting towards a collection that would walk every object the
    process holds (seconds in all, for nothing: none of them is garbage)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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
