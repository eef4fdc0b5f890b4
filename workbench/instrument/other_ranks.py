"""Rank 0's record of what the other tensor-parallel ranks report of each step: their device
times and, for the steps rank 0 profiled, their profiler events on rank 0's clock.

Both are asked for only when the history is read (one message to the ranks each, not one per
step), and go into lists that the steps' records already hold, filled in place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ..history.rank_clock import RankClock, align_steps

DeviceTimes = Callable[[], dict[int, list[float]]]  # launch -> ranks 1..'s device ms
RankEvents = Callable[[], dict[int, list[list[tuple]]]]  # launch -> ranks 1..'s events


class OtherRanks:
    """What ranks 1.. report, given to the records of their steps (by launch: the engine's
    count of steps, the same on every rank). `device_ms` and `events` ask the ranks
    (`Engine.rank_device_ms`, `Engine.rank_events`); None: no engine of ranks behind."""

    def __init__(self, device_ms: DeviceTimes | None = None, events: RankEvents | None = None):
        self.ask_device_ms, self.ask_events = device_ms, events
        self.session_running = False  # rank 0's profiler runs: its events are not read yet
        self.restart()

    @property
    def present(self) -> bool:
        return self.ask_device_ms is not None

    def like(self) -> OtherRanks:
        """The same ranks, nothing waiting (a probe for another record level)."""
        return OtherRanks(self.ask_device_ms, self.ask_events)

    def restart(self) -> None:
        self._times: dict[int, list[float]] = {}  # launch -> its record's list, to fill
        self._early_times: dict[int, list[float]] = {}  # reported before their record was built
        # launch -> (rank 0's events of the step, its record's lists of the other ranks' events
        # and of their clocks' offsets)
        self._events: dict[int, tuple[list, list, list]] = {}
        self._early_events: dict[int, list[list[tuple]]] = {}  # launch -> each rank's events
        self._clocks: dict[int, RankClock] = {}  # rank -> what moves its clock onto rank 0's

    def times_of(self, launch: int) -> list[float]:
        """The list a record holds for ranks 1..'s device times of step `launch` (filled
        when they are read)."""
        times = self._early_times.pop(launch, None)
        if times is None:
            times = self._times[launch] = []
        return times

    def events_of(self, launch: int, events0: list) -> tuple[list, list]:
        """The lists a profiled step's record holds for ranks 1..'s events of step `launch` and
        their clocks' offsets: filled when they are read after rank 0's (`events0`, filled when
        its session is)."""
        into: tuple[list, list] = ([], [])
        self._events[launch] = (events0, *into)
        return into

    def read_times(self) -> bool:
        """Ranks 1..'s device times into the records that wait for them; whether any did."""
        if not self._times:
            return False
        try:
            reported = self.ask_device_ms()
        except RuntimeError:  # a rank died: its times are lost, not the rest of the history
            reported = {}
        for launch, times in reported.items():
            if launch in self._times:
                self._times.pop(launch)[:] = times
            else:  # a batch in flight (overlap): its record comes later
                self._early_times[launch] = times
        self._times.clear()  # steps whose times a rank no longer kept
        return True

    def read_events(self) -> bool:
        """Ranks 1..'s events into the profiled records that wait for them, each step's on rank
        0's clock (`rank_clock.align_steps`); only once rank 0's own events of those steps are
        read. Whether any record got some."""
        if not self._events or self.ask_events is None:
            return False
        if any(launch not in self._early_events for launch in self._events):
            with contextlib.suppress(RuntimeError):  # a rank died: its events are lost
                self._early_events.update(self.ask_events())
        ready = [
            (lists, self._early_events.pop(launch))
            for launch, lists in sorted(self._events.items())
            if self._early_events.get(launch)
        ]
        aligned = align_steps([(lists[0], others) for lists, others in ready], self._clocks)
        for ((_, into, offsets), _), (moved, ms) in zip(ready, aligned):
            into[:], offsets[:] = moved, ms
        # NOTE: records come in launch order: what is left of earlier launches has no record
        last = max(self._events)
        self._events.clear()
        self._early_events = {k: v for k, v in self._early_events.items() if k > last}
        return bool(ready)
