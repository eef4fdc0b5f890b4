"""A stopped profiler session's events on the run's clock, and the step each belongs to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import torch

MIN_CPU_OP_NS = 10_000  # shorter host operators are dropped (kernels and ranges are kept)
# NOTE: kept however short: the ranks' clocks are aligned on them
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


class Capture(NamedTuple):
    """A stopped session's events, the start of every host event it recorded, kept or not, and
    every CUDA runtime or driver call's middle (us) and correlation id, kept or not: a kernel's
    `link` names the call that launched it."""

    events: list[Event]
    host_us: np.ndarray
    launches: np.ndarray  # (n, 2) float64: middle, correlation id


class StepEvents(list):
    """A profiled step's events, and `profiler_ms`: the host time the profiler added to it."""

    profiler_ms: float = 0.0


class Event(NamedTuple):
    """One profiler event on the run's clock; a kernel's `link` is the correlation id CUPTI gave
    the runtime or driver call that launched it (0 for host events)."""

    name: str
    category: str  # "hook" (a range of ours), "kernel", "cpu_op"
    track: str  # "cpu:<thread>" or "gpu:<device>:<stream>"
    start_us: float
    duration_us: float
    link: int


SKEW_US = 20.0  # how far the profiler's clock and the run's may disagree


def assign_to_steps(
    events: list[Event],
    marks: list[tuple[float, int, str]],
    range_marks: Mapping[str, str] | None = None,
    launches: np.ndarray | None = None,
) -> dict[int, list[tuple]]:
    """Step -> its events' first five fields. `marks`: (seconds, step, "launch" | "collect"); a
    host event goes to the last mark before it (of its kind, for `range_marks`), a kernel to the
    step of the call that launched it (`launches`, from `Capture`), or where that call was not
    recorded, to the last mark before the kernel's own middle."""
    if not events:
        return {}
    names, categories, _, starts, durations, links = zip(*events)
    codes = {name: _MARK_CODES[which] for name, which in (range_marks or {}).items()}
    mid = np.array(starts) + np.array(durations) / 2
    link = np.array(links, dtype=np.int64)
    kind = np.array(
        [codes.get(n, 0) if c == "hook" else 0 for n, c in zip(names, categories)],
        dtype=np.int8,
    )
    step = np.full(len(events), _NONE, dtype=np.int64)
    host = np.array([c != "kernel" for c in categories], dtype=bool)
    for code, which, skew in ((0, None, 0.0), (1, "launch", SKEW_US), (2, "collect", SKEW_US)):
        chosen = host & (kind == code)
        kept = [m for m in marks if which is None or m[2] == which]
        step[chosen] = _last_before(kept, mid[chosen] + skew)
    kernels = np.flatnonzero(~host)
    found = np.zeros(len(kernels), dtype=bool)
    if launches is not None and len(launches) and len(kernels):
        order = np.argsort(launches[:, 1], kind="stable")
        keys = launches[order, 1].astype(np.int64)
        values = _last_before(marks, launches[order, 0])
        at = np.searchsorted(keys, link[kernels], side="right") - 1
        found = (at >= 0) & (link[kernels] != 0)
        found[found] = keys[at[found]] == link[kernels][found]
        step[kernels[found]] = values[at[found]]
    lost = kernels[~found]
    step[lost] = _last_before(marks, mid[lost])
    out: dict[int, list[tuple]] = {s: [] for s in np.unique(step).tolist() if s != _NONE}
    for e, s in zip(events, step.tolist()):
        if s != _NONE:
            out[s].append(e[:5])
    return out


_MARK_CODES = {"launch": 1, "collect": 2}
_NONE = -(2**62)


def _last_before(marks: list[tuple[float, int, str]], t: np.ndarray) -> np.ndarray:
    marks = sorted(marks)
    times = np.array([m[0] for m in marks], dtype=np.float64) * 1e6
    steps = np.array([m[1] for m in marks] + [_NONE], dtype=np.int64)
    return steps[np.searchsorted(times, t, side="right") - 1]


def host_events_by_step(host_us: np.ndarray, marks: list[tuple[float, int, str]]) -> dict[int, int]:
    """How many of a session's host events fell in each step."""
    if not len(host_us) or not marks:
        return {}
    steps, counts = np.unique(_last_before(marks, host_us), return_counts=True)
    return {s: n for s, n in zip(steps.tolist(), counts.tolist()) if s != _NONE}


_DEVICE_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})
_HOST_KINDS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"})
_LAUNCHES = frozenset({"cuda_runtime", "cuda_driver"})


def _is_launch(kind: str, name: str) -> bool:
    """A CUDA runtime or driver call (torch 2.11's events have no kind: by its name then)."""
    if kind:
        return kind in _LAUNCHES
    return name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper())


def read_events(events: list, offset_us: float, ranges: frozenset[str] = frozenset()) -> Capture:
    """A stopped session's events (kineto's, `results.events()`), shifted by `offset_us` to its
    clock. A kernel's and its launching call's `correlation_id()` are CUPTI's, the same number;
    a kernel's `linked_correlation_id()` names the operator around its launch, and is 0 where,
    as on a GPU here (`ProfilerSession`), operators are not recorded."""
    offset, cuda, hooks = offset_us, torch.autograd.DeviceType.CUDA, ranges
    tracks: dict[tuple, str] = {}
    out, host, launches = [], [], []
    append, counted, launched = out.append, host.append, launches.append
    # NOTE: each accessor is a call into C++, so dropped events are read as little as possible
    kinds = bool(events) and hasattr(events[0], "activity_type")
    for e in events:
        kind = e.activity_type() if kinds else ""
        if kind in _DEVICE_KINDS or (kind not in _HOST_KINDS and e.device_type() == cuda):
            duration = e.duration_ns()
            if duration <= 0:
                continue
            name = e.name()
            if name in hooks:  # its host twin is kept
                continue
            where = (e.device_index(), e.device_resource_id())
            track = tracks.get(where) or tracks.setdefault(where, "gpu:{}:{}".format(*where))
            start = e.start_ns() / 1e3 + offset
            append(Event(name, "kernel", track, start, duration / 1e3, e.correlation_id()))
            continue
        duration = e.duration_ns()
        if duration <= 0:
            continue
        start = e.start_ns() / 1e3 + offset
        counted(start)
        short = duration < MIN_CPU_OP_NS
        if kinds and short and kind in _LAUNCHES:
            launched((start + duration / 2e3, e.correlation_id()))
            continue
        name = e.name()
        if _is_launch(kind, name):
            launched((start + duration / 2e3, e.correlation_id()))
            if short:
                continue
        if name in hooks:
            category = "hook"
        elif (short or name in _BOOKKEEPING) and name not in ALL_REDUCES:
            continue
        else:
            category = "cpu_op"
        thread = e.start_thread_id()
        track = tracks.get(thread) or tracks.setdefault(thread, f"cpu:{thread}")
        append(Event(name, category, track, start, duration / 1e3, 0))
    calls = np.array(launches, dtype=np.float64).reshape(-1, 2)
    return Capture(out, np.array(host, dtype=np.float64), calls)
