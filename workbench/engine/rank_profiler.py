"""A tensor-parallel rank above 0's profiler: the steps rank 0 profiles (record="full"), profiled
here too, so the run's timeline has every rank's kernels.

Rank 0's step message says whether its own profiler runs at the launch (`StepMessage.profile`).
One session covers consecutive profiled steps, as on rank 0; each step's events are those
between its start and its end here (a kernel: those its step's range launched), on this
process's own clock (`time.perf_counter`, in microseconds). Nothing is read until rank 0 asks
(`Ranks.events`), which it does when its own events are read; rank 0 then aligns each step's
events on its clock at the step's all-reduces (`history/rank_clock.py`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

from ..profiling import ProfilerSession, assign_to_steps, gc_paused

STEP_RANGE = "rank.step"  # the range around each profiled step here (its kernels link to it)


class RankProfiler:
    """The profiler session of a rank above 0, and what it recorded until rank 0 reads it."""

    def __init__(self, device: torch.device) -> None:
        self._session = ProfilerSession(time.perf_counter, device, frozenset({STEP_RANGE}))
        # (seconds, launch, "launch") where a profiled step began, (seconds, -1, "launch") where
        # it ended: what lies between two steps (waiting for rank 0's next message) is no step's
        self._marks: list[tuple[float, int, str]] = []
        self._unread: list[tuple[Callable[[], list], list]] = []  # ended sessions: read, marks

    @contextlib.contextmanager
    def step(self, launch: int, profile: bool) -> Iterator[None]:
        """Around the step `launch` (the engine's count of steps before it), profiled when
        `profile`; a step that is not ends the session that runs."""
        if not profile:
            self.pause()
            yield
            return
        if not self._session.running:
            self._session.start()
        self._marks.append((time.perf_counter(), launch, "launch"))
        try:
            with torch.profiler.record_function(STEP_RANGE):
                yield
        finally:
            self._marks.append((time.perf_counter(), -1, "launch"))

    def pause(self) -> None:
        """End the session, if one runs (its events are read when rank 0 asks)."""
        if self._session.running:
            marks, self._marks = self._marks, []
            self._unread.append((self._session.stop(), marks))

    def events(self) -> dict[int, list[tuple]]:
        """The events of the steps profiled since the last call: launch -> (name, category,
        track, start_us, duration_us) tuples, on this process's clock."""
        self.pause()
        unread, self._unread = self._unread, []
        out: dict[int, list[tuple]] = {}
        with gc_paused():
            for read, marks in unread:
                for launch, events in assign_to_steps(read().events, marks).items():
                    if launch >= 0:
                        out.setdefault(launch, []).extend(events)
        return out

    def close(self) -> None:
        self._session.discard()
        self._unread = []
