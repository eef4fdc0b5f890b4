"""The clocks of a run: `RunClock`, the run's time axis, and `StageClock`, one batch's host
time stage by stage.

A step's host work runs through named stages: `schedule` (pick the batch, admit), `prepare`
(allocate its KV pages), `plan` (the engine's prepare: every device-side write of the step, its
inputs and the attention metadata), `forward` (launch the forward: a graph replay or the eager
layers; with tensor parallelism the step message to the other ranks), `sample` (sampling, the
tokens to the token pool and the host), `share` (prompt pages to the prefix cache, the running
set), `collect` (the tokens on the host: append, finish, free) and `record` (the step's record,
hooks, page snapshots). `wait` is the host blocked on the device for the tokens: not host work,
kept apart.
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
        self._paused_at: float | None = None  # when the clock stopped (None: it runs)

    def now(self) -> float:
        now = self._paused_at if self._paused_at is not None else time.perf_counter()
        return now - self._t0

    def restart(self) -> None:
        """A new run: the clock from zero (still paused, if it was)."""
        self._t0 = time.perf_counter()
        if self._paused_at is not None:
            self._paused_at = self._t0

    def pause(self) -> None:
        """Stop the clock: a workbench stepped by hand pauses it between calls, so the time a
        person takes between two cells is not the run's."""
        if self._paused_at is None:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._t0 += time.perf_counter() - self._paused_at
            self._paused_at = None

    def wait_until(self, seconds: float) -> None:
        """Let the clock reach `seconds` (an idle engine waiting for a request to arrive)."""
        time.sleep(max(0.0, seconds - self.now()))


class StageClock:
    """Milliseconds per stage of one batch's host work (`ms`), and the stage running now (what
    a failure names). With `ranges` (a profiler session runs), each stage also runs inside the
    profiler range of the hook point reported at its end (`RANGES`)."""

    __slots__ = ("stage", "ms", "ranges", "_since", "_range")

    def __init__(self, ranges: bool = False) -> None:
        self.stage: str | None = "schedule"  # None: paused
        self.ms = dict.fromkeys(STAGES, 0.0)
        self.ranges = ranges
        self._range = None  # the profiler range open now
        if ranges:
            self._switch_range(None, RANGES["schedule"])
        self._since = time.perf_counter()

    def enter(self, stage: str | None) -> None:
        """The work from now on is `stage`'s (None: nobody's, the clock pauses); the time since
        the last change goes to the stage that ran."""
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
        """Host milliseconds per stage, in `HOST_STAGES` order (waiting left out)."""
        return tuple(map(self.ms.__getitem__, HOST_STAGES))
