"""Tensor parallelism, one timeline: every rank's profiler events on rank 0's clock, by offsets
bounded at the all-reduces (`CLOCK_ALIGNMENT`), narrowed by neighbouring steps' (clocks drift
slowly)."""

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
# all-gathers are left out: the ranks' control messages use gloo's all-gather too
NCCL_ALL_REDUCE = "AllReduce"
WINDOW_STEPS = 8  # the steps on either side whose bounds narrow a step's
Bounds = tuple[float, float]  # (us)


def all_reduces(events: Iterable[tuple]) -> list[tuple[float, float]]:
    """(start_us, end_us) of one rank's all-reduces in a step: its NCCL kernels, else host work."""
    kernels, host = [], []
    for name, category, _, start, duration in events:
        if category == "kernel" and NCCL_ALL_REDUCE in name:
            kernels.append((start, start + duration))
        elif name in ALL_REDUCES:
            host.append((start, start + duration))
    return sorted(kernels or host)


def step_bounds(reference: list[tuple], other: list[tuple]) -> Bounds | float | None:
    """A step's paired all-reduces' bounds on the offset; if they contradict, the ends' gap."""
    pairs = list(zip(reference, other))
    if not pairs:
        return None
    low = max(start0 - end for (start0, _), (_, end) in pairs)
    high = min(end0 - start for (_, end0), (start, _) in pairs)
    if low <= high:
        return (low, high)
    return float(np.median([end0 - end for (_, end0), (_, end) in pairs]))


class RankClock:
    """One rank's clock offset, step after step."""

    def __init__(self) -> None:
        self.past: deque[Bounds] = deque(maxlen=WINDOW_STEPS)
        self.last: float | None = None

    def offsets_us(self, steps: list[Bounds | float | None]) -> list[float | None]:
        """The offset of each of `steps` (their `step_bounds`); None: none yet."""
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
    """The middle of step i's bounds, narrowed by its neighbours' that leave room, nearest first."""
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
    """For each of `steps` (rank 0's events, [rank 1's, ..]): the (rank, its events moved onto rank
    0's clock) pairs and each rank's offset in ms (NaN: none yet, the rank left out)."""
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
