"""Rank 0's profiler (record="full"): the session of `workbench.profiling` with the hook points'
ranges as its own, and the hook ranges that belong to a step's launch or to its collect."""

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
    events: list[Event], marks: list[tuple[float, int, str]]
) -> dict[int, list[tuple]]:
    """Each event's step (`profiling.assign_to_steps`): a hook range to the last launch or
    collect mark before it, as the hook point belongs to one or the other."""
    return profiling.assign_to_steps(events, marks, RANGE_MARKS)


class SessionEvents:
    """An ended session's events, waiting in the history until it is read (`History.fill_in`):
    then each step's go into the list its record holds, with the host time the profiler added
    to it (`StepEvents.profiler_ms`)."""

    def __init__(
        self,
        read: Callable[[], Capture],
        marks: list[tuple[float, int, str]],
        lists: dict[int, list],
        start_ms: dict[int, float],
        device: torch.device,
    ) -> None:
        """`read`: the stopped session's reader; `marks`: where each step's launch and collect
        began; `lists`: step -> the list its record holds; `start_ms`: a session's start in the
        step it chose (taken from it as it is used)."""
        self.read, self.marks, self.lists = read, marks, lists
        self.start_ms, self.device = start_ms, device

    def fill(self) -> None:
        lists = self.lists
        with gc_paused():
            capture = self.read()
            cost_ms = event_cost_us(self.device) / 1e3
            for step, assigned in assign_to_steps(capture.events, self.marks).items():
                if step in lists:
                    lists[step].extend(assigned)
            for step, count in host_events_by_step(capture.host_us, self.marks).items():
                if step in lists:
                    lists[step].profiler_ms = count * cost_ms + self.start_ms.pop(step, 0.0)
