"""Tensor parallelism, one timeline for all ranks: every rank's profiler events on rank 0's clock.

Each rank records its events on its own clock, and each step's events of a rank above 0 move
onto rank 0's clock by one offset, found at the all-reduces. An all-reduce is a barrier: no rank
ends it before every rank has begun it. So each all-reduce bounds the offset (rank r's clock +
offset = rank 0's) from both sides:

    rank 0's start - rank r's end <= offset <= rank 0's end - rank r's start.

A step's all-reduces give the tightest of these; clocks drift slowly (on one host, not at all),
so the bounds of the `WINDOW_STEPS` steps on either side narrow them further (the nearest first,
each only where it leaves some room: bounds that exclude one another mean the clock moved). The
offset is the middle of what is left, off the true one by at most half its width. The ends' gaps
alone do worse: on a busy CPU a thread woken late records an end milliseconds late. Measured on
the busy 2-core CPU over runs of 11 and 12 steps (gloo ranks on one host: their clocks are the
host's, so the true offset is known), the median of a step's end gaps was up to 1.0 ms (two
ranks) and 1.9 ms (three) off the truth, the middle of one step's bounds up to 0.43 and 1.7 ms,
with eight steps on either side 0.03 and 0.14 ms. A step whose own bounds contradict each other
(records that do not pair up) takes the median of its ends' gaps; a step without all-reduces
keeps the rank's last offset.

The all-reduces are NCCL's kernels on a GPU (a name with "AllReduce"), else their host work
(`profiling.ALL_REDUCES`: gloo's runs on a thread of its own from when the rank hands it over).
All-gathers are left out: the ranks' control messages use gloo's all-gather too.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

from ..profiling import ALL_REDUCES

CLOCK_ALIGNMENT = (
    "each rank's events moved onto rank 0's clock, step by step, by one offset found at the "
    "all-reduces: no rank ends an all-reduce before every rank has begun it, so each bounds it "
    "(rank 0's start - rank r's end <= offset <= rank 0's end - rank r's start); the offset is "
    "the middle of the tightest bounds of the step's all-reduces and of its neighbours' (the "
    "steps table's clock_offset_ms_rank<r>)"
)
NCCL_ALL_REDUCE = "AllReduce"  # in the name of each of NCCL's all-reduce kernels
WINDOW_STEPS = 8  # the steps on either side whose bounds narrow a step's
Bounds = tuple[float, float]  # the least and the most the offset can be (us)


def all_reduces(events: Iterable[tuple]) -> list[tuple[float, float]]:
    """(start_us, end_us) of one rank's all-reduces in a step, in order, from its (name,
    category, track, start_us, duration_us) events: its NCCL kernels if any, else host work."""
    kernels, host = [], []
    for name, category, _, start, duration in events:
        if category == "kernel" and NCCL_ALL_REDUCE in name:
            kernels.append((start, start + duration))
        elif name in ALL_REDUCES:
            host.append((start, start + duration))
    return sorted(kernels or host)


def step_bounds(reference: list[tuple], other: list[tuple]) -> Bounds | float | None:
    """What one step's all-reduces (`all_reduces` of rank 0 and of another rank, paired in
    order) say of the offset: its bounds; where they contradict each other, the median of the
    ends' gaps alone; None: no all-reduce."""
    pairs = list(zip(reference, other))
    if not pairs:
        return None
    low = max(start0 - end for (start0, _), (_, end) in pairs)
    high = min(end0 - start for (_, end0), (start, _) in pairs)
    if low <= high:
        return (low, high)
    return float(np.median([end0 - end for (_, end0), (_, end) in pairs]))


class RankClock:
    """What moves one rank's clock onto rank 0's, step after step: the bounds of the steps it
    aligned last (the next steps' window reaches back to them), and the last offset."""

    def __init__(self) -> None:
        self.past: deque[Bounds] = deque(maxlen=WINDOW_STEPS)
        self.last: float | None = None

    def offsets_us(self, steps: list[Bounds | float | None]) -> list[float | None]:
        """The offset of each of `steps` (their `step_bounds`, in launch order), as the
        module's docstring says; None: no offset yet."""
        window = [*self.past, *steps]
        out = []
        for i in range(len(self.past), len(window)):
            own = window[i]
            if isinstance(own, tuple):
                self.last = _middle(window, i)
            elif own is not None:
                self.last = own
            out.append(self.last)
        self.past.extend(b for b in steps if isinstance(b, tuple))
        return out


def _middle(window: list, i: int) -> float:
    """The middle of step i's bounds, narrowed by its neighbours' nearest first (those that
    leave no room are left out)."""
    low, high = window[i]
    for distance in range(1, WINDOW_STEPS + 1):
        for j in (i - distance, i + distance):
            if 0 <= j < len(window) and isinstance(window[j], tuple):
                narrower = max(low, window[j][0]), min(high, window[j][1])
                if narrower[0] <= narrower[1]:
                    low, high = narrower
    return (low + high) / 2


def align_steps(
    steps: list[tuple[list, list[list]]], clocks: dict[int, RankClock]
) -> list[tuple[list[tuple[int, list[tuple]]], list[float]]]:
    """Steps' events of ranks 1.. on rank 0's clock. For each of `steps` (rank 0's events,
    [rank 1's, rank 2's, ..]), in launch order: the (rank, its events moved) pairs and each
    rank's offset (ms, rank 0's clock minus the rank's; NaN where it has none yet, the rank
    then left out of the step). `clocks`: each rank's `RankClock`, made here when missing."""
    references = [all_reduces(events0) for events0, _ in steps]
    offsets = {}
    for rank in range(1, max((len(others) for _, others in steps), default=0) + 1):
        bounds = [
            step_bounds(ref, all_reduces(others[rank - 1])) if len(others) >= rank else None
            for ref, (_, others) in zip(references, steps)
        ]
        offsets[rank] = clocks.setdefault(rank, RankClock()).offsets_us(bounds)
    out = []
    for i, (_, others) in enumerate(steps):
        moved, ms = [], []
        for rank, events in enumerate(others, start=1):
            offset = offsets[rank][i]
            ms.append(math.nan if offset is None else offset / 1e3)
            if offset is not None:
                moved.append((rank, [(n, c, t, s + offset, d) for n, c, t, s, d in events]))
        out.append((moved, ms))
    return out
