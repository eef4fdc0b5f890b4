"""Rank 0's profiler (record="full"): hook ranges, and which belong to a launch or a collect."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import profiling
from ..profiling import Capture, Event, activities, event_cost_us, gc_paused, host_events_by_step
from .hooks import HOOK_POINTS

__all__ = [
    "Event",
    "ProfilerSession",
    "SessionEvents",
    "activities",
    "assign_to_steps",
    "gc_paused",
]

LAUNCH_RANGES = frozenset({"schedule.end", "batch.prepared", "forward.end"})
COLLECT_RANGES = frozenset({"sample.end", "step.end"})
HOOK_RANGES = frozenset(HOOK_POINTS)
RANGE_MARKS = {**dict.fromkeys(LAUNCH_RANGES, "launch"), **dict.fromkeys(COLLECT_RANGES, "collect")}


class ProfilerSession(profiling.ProfilerSession):
    """A session whose "hook" events are the hook points' ranges."""

    def __init__(self, clock: Callable[[], float], device: torch.device) -> None:
        super().__init__(clock, device, HOOK_RANGES)


def assign_to_steps(
    capture: Capture, marks: list[tuple[float, int, str]]
) -> dict[int, list[tuple]]:
    """Each event's step; a hook range goes to the last launch or collect mark before it."""
    return profiling.assign_to_steps(capture.events, marks, RANGE_MARKS, capture.launches)


class SessionEvents:
    """An ended session's events, given to the steps' records when the history is read."""

    def __init__(
        self,
        read: Callable[[], Capture],
        marks: list[tuple[float, int, str]],
        lists: dict[int, list],
        start_ms: dict[int, float],
        device: torch.device,
    ) -> None:
        self.read, self.marks, self.lists = read, marks, lists
        self.start_ms, self.device = start_ms, device

    def fill(self) -> None:
        lists = self.lists
        with gc_paused():
            capture = self.read()
            cost_ms = event_cost_us(self.device) / 1e3
            for step, assigned in assign_to_steps(capture, self.marks).items():
                if step in lists:
                    lists[step].extend(assigned)
            for step, count in host_events_by_step(capture.host_us, self.marks).items():
                if step in lists:
                    lists[step].profiler_ms = count * cost_ms + self.start_ms.pop(step, 0.0)
