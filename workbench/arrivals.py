"""Requests added ahead of their arrival: at a step of the run, or at a time on its clock."""

from __future__ import annotations

import bisect
from typing import NamedTuple

from .core import SamplingParams


class Due(NamedTuple):
    at: float  # the step, or the seconds on the run's clock, it arrives at
    uid: int
    ids: list[int]
    sampling: SamplingParams
    timed: bool = False  # `at` is seconds (else a step)


def _order(due: Due) -> tuple[float, int]:
    return due.at, due.uid


class Arrivals:
    """The requests due to arrive, by step and by time, in arrival order.

    NOTE: an idle engine takes the next request due at a step at once (empty steps do not
    count), but waits for one due at a time, as a server would, so its TTFT counts from arrival.
    One that falls due while a step runs is queued when the step ends, as a server's request
    waits for the step in progress, and it arrived at its time: its TTFT counts from there.
    """

    def __init__(self) -> None:
        self._by_step: list[Due] = []
        self._by_time: list[Due] = []
        self.waiting = 0  # kept as a count: read every step

    def add(self, due: Due, by_time: bool) -> None:
        waiting = self._by_time if by_time else self._by_step
        bisect.insort(waiting, due._replace(timed=by_time), key=_order)
        self.waiting += 1

    def due(self, step: int, now: float, idle: bool) -> list[Due]:
        out = []
        while self._by_time and self._by_time[0].at <= now:
            out.append(self._by_time.pop(0))
        while self._by_step and (self._by_step[0].at <= step or (idle and not out)):
            out.append(self._by_step.pop(0))
        self.waiting -= len(out)
        return out

    def release(self, scheduler) -> None:
        clock = scheduler.clock
        for due in self.due(scheduler.step_index, clock.now(), scheduler.is_idle):
            _add(scheduler, due)
        if scheduler.is_idle and self.next_time is not None:
            clock.wait_until(self.next_time)  # (a twin's clock jumps there)
            for due in self.due(scheduler.step_index, clock.now(), idle=False):
                _add(scheduler, due)

    @property
    def next_time(self) -> float | None:
        return self._by_time[0].at if self._by_time else None

    def take(self, uid: int) -> Due | None:
        for waiting in (self._by_step, self._by_time):
            for due in waiting:
                if due.uid == uid:
                    waiting.remove(due)
                    self.waiting -= 1
                    return due
        return None

    def clear(self) -> None:
        self._by_step.clear()
        self._by_time.clear()
        self.waiting = 0

    def __iter__(self):
        return iter(self._by_step + self._by_time)

    def __len__(self) -> int:
        return self.waiting


def _add(scheduler, due: Due) -> None:
    arrived = due.at if due.timed else None  # (by step: when it is added)
    scheduler.add_request(due.ids, due.sampling, uid=due.uid, arrived=arrived)
