"""A step's host time, stage by stage.

A step's host work runs through named stages: `schedule` (pick the batch, admit), `prepare`
(allocate its KV pages, build its inputs), `plan` (attention metadata, a CUDA graph's buffers),
`forward` (launch the forward: a graph replay or the eager layers; with tensor parallelism the
step message to the other ranks), `sample` (sampling, the tokens to the token pool and the
host), `share` (prompt pages to the prefix cache, the running set), `collect` (the tokens on
the host: append, finish, free) and `record` (hook events, the step record, page snapshots).
`wait` is the host blocked on the device for the tokens: not host work, kept apart.

One `StageClock` follows one batch from its launch to its record. Whoever does the work says
where it is (`clock.enter("plan")`, or ``with clock.during("prepare", around):`` for a stage the
scheduler reports when it ends); the clock adds the time since the last change to the stage
that ran, and its current stage is what a failure names.
"""

from __future__ import annotations

import time

HOST_STAGES = ("schedule", "prepare", "plan", "forward", "sample", "share", "collect", "record")
STAGES = (*HOST_STAGES, "wait")


class StageClock:
    """Milliseconds per stage of one batch's host work (`ms`), and the stage running now."""

    __slots__ = ("stage", "ms", "_since")

    def __init__(self, stage: str = "schedule") -> None:
        self.stage: str | None = stage  # None: paused
        self.ms = dict.fromkeys(STAGES, 0.0)
        self._since = time.perf_counter()

    def enter(self, stage: str | None) -> None:
        """The work from now on is `stage`'s (None: nobody's, the clock pauses); the time since
        the last change goes to the stage that ran."""
        now = time.perf_counter()
        if self.stage is not None:
            self.ms[self.stage] += (now - self._since) * 1e3
        self.stage, self._since = stage, now

    def during(self, stage: str, around) -> Stage:
        """``with clock.during("prepare", around):`` the work inside is `stage`'s, within the
        context `around` (the profiler range of the hook point reported after it); when it
        ends, the report's time goes to "record". A failure inside leaves `stage` current."""
        return Stage(self, stage, around)

    def host_ms(self) -> tuple[float, ...]:
        """Host milliseconds per stage, in `HOST_STAGES` order (waiting left out)."""
        return tuple(self.ms[s] for s in HOST_STAGES)


class Stage:
    """A stage of a step's host work as a context (`StageClock.during`)."""

    __slots__ = ("clock", "name", "around")

    def __init__(self, clock: StageClock, name: str, around) -> None:
        self.clock, self.name, self.around = clock, name, around

    def __enter__(self) -> StageClock:
        self.clock.enter(self.name)
        self.around.__enter__()
        return self.clock

    def __exit__(self, kind, value, traceback) -> bool:
        self.around.__exit__(kind, value, traceback)
        if kind is None:  # failed, the stage stays the one named
            self.clock.enter("record")
        return False
