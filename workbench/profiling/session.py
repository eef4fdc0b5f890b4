"""The profiler session of record="full": one torch.profiler (kineto) session over many steps."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from collections.abc import Callable

import torch

from .capture import Capture, read_events
from .cost import measure_event_cost


def activities(device: torch.device) -> list:
    from torch.profiler import ProfilerActivity

    if device.type != "cuda":
        return [ProfilerActivity.CPU]
    release_cupti_at_stop()
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def release_cupti_at_stop() -> None:
    """Set `TEARDOWN_CUPTI=1` before the first profiler starts: otherwise kineto keeps CUPTI's
    callbacks subscribed after a session, and every later CUDA call pays for them."""
    os.environ.setdefault("TEARDOWN_CUPTI", "1")


class ProfilerSession:
    """One kineto session over many steps (a start and stop per step would synchronise each).
    `ranges`: our `record_function` ranges; NOTE: on a GPU only these are recorded on the host,
    as tracing every operator slows it several times over."""

    def __init__(
        self, clock: Callable[[], float], device: torch.device, ranges: frozenset[str] = frozenset()
    ) -> None:
        self._clock, self._cuda, self._ranges = clock, device.type == "cuda", ranges
        self._device = device
        self._activities = set(activities(device))
        self._results_of = None  # stops the session; gives kineto's results
        self._offset_us = 0.0
        self.start_ms = 0.0  # what its last start took

    @property
    def running(self) -> bool:
        return self._results_of is not None

    def start(self) -> None:
        from torch._C._profiler import RecordScope
        from torch.autograd import _disable_profiler, _enable_profiler, _prepare_profiler
        from torch.autograd.profiler import profile

        began = time.perf_counter()
        config = profile(use_kineto=True).config()
        scopes = {RecordScope.USER_SCOPE} if self._cuda else set()
        with measure_event_cost(self._device), _quiet_stderr():
            _prepare_profiler(config, self._activities)
            _enable_profiler(config, self._activities, scopes)
        self._offset_us = clock_offset_us(self._clock)
        self._results_of = _disable_profiler
        _RUNNING.add(self)
        seconds = time.perf_counter() - began
        self.start_ms, _SECONDS["start"] = seconds * 1e3, _SECONDS["start"] + seconds
        _SECONDS["sessions"] += 1

    def stop(self) -> Callable[[], Capture]:
        """End the session; returns the (slow) reader of its events."""
        disable, self._results_of = self._results_of, None
        _RUNNING.discard(self)
        if self._cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        with _quiet_stderr():
            results = disable()
        _SECONDS["stop"] += time.perf_counter() - began
        return functools.partial(_read, results, self._offset_us, self._ranges)

    def discard(self) -> None:
        if self._results_of is not None:
            disable, self._results_of = self._results_of, None
            _RUNNING.discard(self)
            with _quiet_stderr():
                disable()


def clock_offset_us(clock: Callable[[], float], tries: int = 7) -> float:
    """The run's clock less kineto's Unix clock (us), from the try with the closest readings."""
    best = None
    for _ in range(tries):
        before = time.time_ns()
        ours = clock()
        after = time.time_ns()
        if best is None or after - before < best[0]:
            best = (after - before, ours * 1e6 - (before + after) / 2e3)
    return best[1]


# NOTE: kineto is one profiler per process, so "a session runs" is a fact of the process
_RUNNING: set[ProfilerSession] = set()


_SECONDS = {"start": 0.0, "stop": 0.0, "list": 0.0, "read": 0.0, "sessions": 0}


def session_seconds() -> dict[str, float]:
    """Host seconds this process spent starting ("start") and stopping ("stop") sessions, and
    reading stopped ones' events: kineto's list of them ("list") and our pass over it that keeps
    some ("read"); and how many sessions it started ("sessions")."""
    return dict(_SECONDS)


def _read(results, offset_us: float, ranges: frozenset[str]) -> Capture:
    began = time.perf_counter()
    events = results.events()
    listed = time.perf_counter()
    capture = read_events(events, offset_us, ranges)
    _SECONDS["list"] += listed - began
    _SECONDS["read"] += time.perf_counter() - listed
    return capture


def session_running() -> bool:
    """Whether a `ProfilerSession` records in this process now."""
    return bool(_RUNNING)


@contextlib.contextmanager
def gc_paused():
    """No garbage collection meanwhile (reading a session allocates many tuples)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _quiet_stderr():
    """Silence fd 2: kineto prints a line at each start and stop, which notebooks show."""
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
