"""Rank 0's profiler (record="full"): the session of `workbench.profiling` with the hook points'
ranges as its own, and the hook ranges that belong to a step's launch or to its collect."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import profiling
from ..profiling import Event, activities, gc_paused
from .hooks import HOOK_POINTS

__all__ = ["Event", "ProfilerSession", "activities", "assign_to_steps", "gc_paused"]

LAUNCH_RANGES = frozenset({"schedule.end", "batch.prepared", "forward.end"})
COLLECT_RANGES = frozenset({"sample.end", "step.end"})
HOOK_RANGES = frozenset(HOOK_POINTS)
RANGE_MARKS = {**dict.fromkeys(LAUNCH_RANGES, "launch"), **dict.fromkeys(COLLECT_RANGES, "collect")}


class ProfilerSession(profiling.ProfilerSession):
    """A session whose "hook" events are the hook points' ranges."""

    def __init__(self, clock: Callable[[], float], device: torch.device) -> None:
        super().__init__(clock, device, HOOK_RANGES)


def assign_to_steps(
    events: list[Event], marks: list[tuple[float, int, str]]
) -> dict[int, list[tuple]]:
    """Each event's step (`profiling.assign_to_steps`): a hook range to the last launch or
    collect mark before it, as the hook point belongs to one or the other."""
    return profiling.assign_to_steps(events, marks, RANGE_MARKS)
