"""A tensor-parallel rank above 0's profiler: the steps rank 0 profiles, profiled here too; rank 0
aligns their events at the steps' all-reduces (`history/rank_clock.py`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

from ..profiling import ProfilerSession, assign_to_steps, gc_paused

STEP_RANGE = "rank.step"  # around each profiled step here (its kernels link to it)


class RankProfiler:
    def __init__(self, device: torch.device) -> None:
        self._session = ProfilerSession(time.perf_counter, device, frozenset({STEP_RANGE}))
        # where each profiled step began (seconds, launch, "launch") and ended (launch -1)
        self._marks: list[tuple[float, int, str]] = []
        self._unread: list[tuple[Callable[[], list], list]] = []

    @contextlib.contextmanager
    def step(self, launch: int, profile: bool) -> Iterator[None]:
        """Around the step `launch`, profiled when `profile` (if not, the session ends)."""
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
        if self._session.running:
            marks, self._marks = self._marks, []
            self._unread.append((self._session.stop(), marks))

    def events(self) -> dict[int, list[tuple]]:
        """Launch -> (name, category, track, start_us, duration_us) since the last call."""
        self.pause()
        unread, self._unread = self._unread, []
        out: dict[int, list[tuple]] = {}
        with gc_paused():
            for read, marks in unread:
                capture = read()
                by_launch = assign_to_steps(capture.events, marks, launches=capture.launches)
                for launch, events in by_launch.items():
                    if launch >= 0:
                        out.setdefault(launch, []).extend(events)
        return out

    def close(self) -> None:
        self._session.discard()
        self._unread = []
