"""Profiler capture (record="full"): one torch.profiler session over many steps, its events
flattened to (name, category, track, start_us, duration_us) on the clock it is given, and each
event's step. Rank 0's probe uses it (`instrument/profiler.py` names its hook ranges), and so does
every tensor-parallel rank above 0 (`engine/rank_profiler.py`), which is why it sits below both."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
import torch

MIN_CPU_OP_NS = 10_000  # host operators shorter than this are not kept (kernels and ranges are)
# NOTE: kept however short: the ranks' clocks are aligned on them, so every rank must keep all
ALL_REDUCES = frozenset({"gloo:all_reduce", "nccl:all_reduce"})
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
    category: str  # "hook" (a range of ours: a hook point's, a rank's step), "kernel", "cpu_op"
    track: str  # "cpu:<thread>" or "gpu:<device>:<stream>"
    start_us: float
    duration_us: float
    corr: int
    link: int


SKEW_US = 20.0  # how far the profiler's clock and the run's may disagree


def assign_to_steps(
    events: list[Event],
    marks: list[tuple[float, int, str]],
    range_marks: Mapping[str, str] | None = None,
) -> dict[int, list[tuple]]:
    """Each event's step. `marks` are where the steps' host work began on the session's clock:
    (seconds, step, "launch") when a batch's launch began (step -1: a launch that found
    nothing to run), (seconds, step, "collect") when its collect began. A hook range named in
    `range_marks` (name -> "launch" or "collect") goes to the last mark of that kind before it
    (give or take the two clocks' skew); another host event
    to the last mark of any kind before it; a kernel or runtime call to the step of the range
    or operator that launched it (by time when that one is not known). Returns step ->
    (name, category, track, start_us, duration_us) tuples, in the events' order."""
    if not events:
        return {}
    # NOTE: whole columns at once: a profiled run has hundreds of thousands of events
    names, categories, _, starts, durations, corrs, links = zip(*events)
    codes = {name: _MARK_CODES[which] for name, which in (range_marks or {}).items()}
    mid = np.array(starts) + np.array(durations) / 2
    corr, link = np.array(corrs, dtype=np.int64), np.array(links, dtype=np.int64)
    kind = np.array(
        [codes.get(n, 0) if c == "hook" else 0 for n, c in zip(names, categories)],
        dtype=np.int8,
    )  # 0: any mark, 1: launch marks, 2: collect marks
    step = np.full(len(events), _NONE, dtype=np.int64)
    host = link == 0
    for code, which, skew in ((0, None, 0.0), (1, "launch", SKEW_US), (2, "collect", SKEW_US)):
        chosen = host & (kind == code)
        kept = [m for m in marks if which is None or m[2] == which]
        step[chosen] = _last_before(kept, mid[chosen] + skew)
    # a linked event: the step of the host event whose correlation id it names
    known = host & (corr != 0) & (step != _NONE)
    order = np.argsort(corr[known], kind="stable")
    keys, values = corr[known][order], step[known][order]
    linked = np.flatnonzero(~host)
    at = np.searchsorted(keys, link[linked], side="right") - 1  # the last of equal ids
    found = at >= 0
    found[found] = keys[at[found]] == link[linked][found]
    step[linked[found]] = values[at[found]]
    lost = linked[~found]
    step[lost] = _last_before(marks, mid[lost])
    out: dict[int, list[tuple]] = {s: [] for s in np.unique(step).tolist() if s != _NONE}
    for e, s in zip(events, step.tolist()):
        if s != _NONE:
            out[s].append(e[:5])
    return out


_MARK_CODES = {"launch": 1, "collect": 2}
_NONE = -(2**62)  # no step (before the first mark)


def _last_before(marks: list[tuple[float, int, str]], t: np.ndarray) -> np.ndarray:
    """The step of the last of `marks` at or before each time `t` (microseconds); _NONE
    before the first."""
    marks = sorted(marks)
    times = np.array([m[0] for m in marks], dtype=np.float64) * 1e6
    steps = np.array([m[1] for m in marks] + [_NONE], dtype=np.int64)  # [-1]: none
    return steps[np.searchsorted(times, t, side="right") - 1]


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
        _RUNNING.add(self)

    def stop(self) -> Callable[[], list[Event]]:
        """End the session. Returns what reads its events, in the order kineto gives them:
        reading a long run's (hundreds of thousands of kernels, a few microseconds of Python
        each) is left until someone looks."""
        disable, self._results_of = self._results_of, None
        _RUNNING.discard(self)
        if self._cuda:
            torch.cuda.synchronize()
        with _quiet_stderr():
            results = disable()
        return functools.partial(read_events, results, self._offset_us, self._ranges)

    def discard(self) -> None:
        if self._results_of is not None:
            disable, self._results_of = self._results_of, None
            _RUNNING.discard(self)
            with _quiet_stderr():
                disable()


# NOTE: kineto is one profiler per process, so "a session runs" is a fact of the process: rank 0's
# engine reads it at each launch to tell the other ranks whether to profile the step too
_RUNNING: set[ProfilerSession] = set()


def session_running() -> bool:
    """Whether a `ProfilerSession` records in this process now."""
    return bool(_RUNNING)


def read_events(results, offset_us: float, ranges: frozenset[str] = frozenset()) -> list[Event]:
    """A stopped session's events (kineto's `results`), on the session's clock (`offset_us`
    from kineto's); `ranges` as `ProfilerSession` says."""
    offset, cuda, hooks = offset_us, torch.autograd.DeviceType.CUDA, ranges
    tracks: dict[tuple, str] = {}
    out = []
    append = out.append
    # NOTE: each accessor is a call into C++ and a run leaves hundreds of thousands of
    # events: the ones dropped (short host calls) go after as few calls as possible
    for e in results.events():
        duration = e.duration_ns()
        if duration <= 0:
            continue
        name = e.name()
        if e.device_type() == cuda:
            # NOTE: a hook range shows on the device too (kineto's GPU annotation of the
            # kernels it launched); its host twin is kept
            if name in hooks:
                continue
            where = (e.device_index(), e.device_resource_id())
            track = tracks.get(where) or tracks.setdefault(where, "gpu:{}:{}".format(*where))
            start, link = e.start_ns() / 1e3 + offset, e.linked_correlation_id()
            append(Event(name, "kernel", track, start, duration / 1e3, 0, link))
            continue
        if name in hooks:
            category = "hook"
        elif (duration < MIN_CPU_OP_NS or name in _BOOKKEEPING) and name not in ALL_REDUCES:
            continue  # most host operators are views and casts of a few microseconds
        else:
            category = "cpu_op"
        thread = e.start_thread_id()
        track = tracks.get(thread) or tracks.setdefault(thread, f"cpu:{thread}")
        link = e.linked_correlation_id()
        # NOTE: a CUDA runtime call (cudaLaunchKernel) links to a range or operator; its own
        # correlation id is CUPTI's, from another sequence that can collide with theirs
        corr = 0 if link else e.correlation_id()
        start = e.start_ns() / 1e3 + offset
        append(Event(name, category, track, start, duration / 1e3, corr, link))
    return out


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
