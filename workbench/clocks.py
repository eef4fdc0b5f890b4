"""The clocks of a run: `RunClock`, the run's time axis, and `StageClock`, one batch's host
time per stage: `schedule` (pick and admit), `prepare` (KV pages), `plan` (device-side inputs,
attention metadata), `forward` (launch), `sample`, `share` (prompt pages to the prefix cache),
`collect` (tokens on the host: append, finish, free), `record`. `wait`, the host blocked on the
device, is kept apart.
"""

from __future__ import annotations

import time

import torch

HOST_STAGES = ("schedule", "prepare", "plan", "forward", "sample", "share", "collect", "record")
STAGES = (*HOST_STAGES, "wait")
# the profiler range each stage runs in, named after the hook point that fires at its end
RANGES = {
    "schedule": "schedule.end",
    "prepare": "batch.prepared",
    "plan": "batch.prepared",
    "forward": "forward.end",
    "sample": "forward.end",
    "share": None,
    "wait": "sample.end",
    "collect": "sample.end",
    "record": "step.end",
    None: None,
}


class RunClock:
    """Seconds since the run started (or was reset), the time it was paused left out."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._paused_at: float | None = None

    def now(self) -> float:
        now = self._paused_at if self._paused_at is not None else time.perf_counter()
        return now - self._t0

    def restart(self) -> None:
        self._t0 = time.perf_counter()
        if self._paused_at is not None:
            self._paused_at = self._t0

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._t0 += time.perf_counter() - self._paused_at
            self._paused_at = None

    def wait_until(self, seconds: float) -> None:
        # NOTE: a day at a time: time.sleep overflows past the platform's time_t (1e12 s)
        left = seconds - self.now()
        while left > 0:
            time.sleep(min(left, 86400.0))
            if self._paused_at is not None:  # (a paused clock stands still)
                return
            left = seconds - self.now()


class StageClock:
    """Milliseconds per stage of one batch's host work, and the stage running now. With
    `ranges`, each stage runs inside its profiler range (`RANGES`)."""

    __slots__ = ("stage", "ms", "ranges", "_since", "_range")

    def __init__(self, ranges: bool = False) -> None:
        self.stage: str | None = "schedule"  # None: paused
        self.ms = dict.fromkeys(STAGES, 0.0)
        self.ranges = ranges
        self._range = None
        if ranges:
            self._switch_range(None, RANGES["schedule"])
        self._since = time.perf_counter()

    def enter(self, stage: str | None) -> None:
        """The work from now on is `stage`'s (None: the clock pauses)."""
        now = time.perf_counter()
        if self.stage is not None:
            self.ms[self.stage] += (now - self._since) * 1e3
        if self.ranges or self._range is not None:
            self._switch_range(RANGES[self.stage], RANGES[stage])
        self.stage, self._since = stage, now

    def _switch_range(self, was: str | None, name: str | None) -> None:
        if was == name and self._range is not None:
            return
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None
        if self.ranges and name is not None:
            self._range = torch.profiler.record_function(name)
            self._range.__enter__()

    def host_ms(self) -> tuple[float, ...]:
        return tuple(map(self.ms.__getitem__, HOST_STAGES))
