"""Ranks 1..'s device times and profiler events, given to rank 0's step records.

NOTE: asked for only when the history is read (one message, not one per step), and filled into
lists the records already hold.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ..history.rank_clock import RankClock, align_steps

DeviceTimes = Callable[[], dict[int, list[float]]]
RankEvents = Callable[[], dict[int, list[list[tuple]]]]


class OtherRanks:
    """What ranks 1.. report, keyed by launch (the step count, the same on every rank)."""

    def __init__(self, device_ms: DeviceTimes | None = None, events: RankEvents | None = None):
        self.ask_device_ms, self.ask_events = device_ms, events
        self.session_running = False
        self.restart()

    @property
    def present(self) -> bool:
        return self.ask_device_ms is not None

    def like(self) -> OtherRanks:
        return OtherRanks(self.ask_device_ms, self.ask_events)

    def restart(self) -> None:
        self._times: dict[int, list[float]] = {}
        self._early_times: dict[int, list[float]] = {}  # reported before their record was built
        self._events: dict[int, tuple[list, list, list]] = {}  # (rank 0's, others', offsets)
        self._early_events: dict[int, list[list[tuple]]] = {}
        self._clocks: dict[int, RankClock] = {}

    def times_of(self, launch: int) -> list[float]:
        times = self._early_times.pop(launch, None)
        if times is None:
            times = self._times[launch] = []
        return times

    def events_of(self, launch: int, events0: list) -> tuple[list, list]:
        into: tuple[list, list] = ([], [])
        self._events[launch] = (events0, *into)
        return into

    def read_times(self) -> bool:
        """Fill waiting records with ranks 1..'s device times; whether any did."""
        if not self._times:
            return False
        try:
            reported = self.ask_device_ms()
        except RuntimeError:  # a rank died: lose its times, not the history
            reported = {}
        for launch, times in reported.items():
            if launch in self._times:
                self._times.pop(launch)[:] = times
            else:
                self._early_times[launch] = times
        self._times.clear()
        return True

    def read_events(self) -> bool:
        """Fill waiting records with ranks 1..'s events on rank 0's clock; whether any did."""
        if not self._events or self.ask_events is None:
            return False
        if any(launch not in self._early_events for launch in self._events):
            with contextlib.suppress(RuntimeError):
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
