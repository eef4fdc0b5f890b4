"""What a scheduler reports as it runs: one call per hook point, in the order they fire.

The scheduler calls its observer with plain values (step indices, batches, counts) and never
looks at what the observer makes of them: at a step's start (`before_step`, only while `inside`)
and end (`step_end`, while `at_end`), and inside it only while `inside` is True, so a step that
nobody watches runs none of this code. The instrumentation's `Probe` (`instrument/probe.py`)
builds the hook events, the step records' history and the profiler session from these calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..clocks import RunClock

if TYPE_CHECKING:
    from ..core import Admissions, Batch, Req
    from ..engine.engine import Launch
    from ..kvcache.table import TableManager
    from .record import Occupancy, StepRecord


class Observer:
    inside = False  # whether it hears of a step's inside (every hook point below)
    at_end = False  # whether it hears of a step's end (`step_end`)
    profiling = False  # a profiler session runs: the step's stages run in profiler ranges
    clock: RunClock  # the run's clock, the scheduler's

    def restart(self) -> None:
        """A new run."""

    def before_step(self, index: int) -> None:
        """Before the scheduler step that launches batch `index`."""

    def request_arrive(
        self,
        step: int,
        uid: int,
        prompt_len: int,
        max_tokens: int,
        seconds: float,
        source: str = "python",
    ) -> None:
        """ "request.arrive": a request is queued; it arrived at `seconds` on the run's clock,
        by `source` ("python", or "http" through the server)."""

    def cache_match_hook(self, step: int) -> Callable[[int, int, int], None] | None:
        """What admission calls on each prefix match, (uid, prompt_len, cached_len); None when
        nobody listens."""
        return None

    def schedule_end(
        self,
        step: int,
        batch: Batch | None,
        admissions: Admissions,
        started: float,
        occupancy: Callable[[], Occupancy] | None = None,
    ) -> None:
        """ "admit" and "reject" per decision, then "schedule.end". `started`: when the launch
        began; `occupancy`: the queue and the KV pool now, when asked."""

    def cache_insert(self, step: int, uid: int, inserted_len: int, already_cached: int) -> None:
        """ "cache.insert": a request's full pages went to the prefix cache."""

    def cache_evict(self, step: int, requested: int, freed: int) -> None:
        """ "cache.evict": unlocked cached pages were freed for an allocation."""

    def batch_prepared(
        self, step: int, batch: Batch, new_pages: int, table: TableManager, launch: Launch
    ) -> dict[int, tuple] | None:
        """ "batch.prepared" (the batch's pages are allocated, the engine has prepared it),
        then "forward.begin" (its forward is about to be launched). Returns the page-table
        rows to keep with its record (None: none kept)."""
        return None

    def forward_end(self, step: int, batch: Batch) -> None:
        """ "forward.end": the forward and the sampler are launched; ledgers moved."""

    def sample_end(self, step: int, batch: Batch, tokens: list[int], started: float) -> None:
        """ "sample.end": the batch's tokens are on the host. `started`: when collecting
        began."""

    def request_finish(
        self, step: int, req: Req, between_steps: bool = False, seconds: float = 0.0
    ) -> None:
        """ "request.finish": a request ended. `between_steps`: not by a token of a step's
        record (an abort, or its step failed, at `seconds`); the scheduler says so whoever
        watches."""

    def step_end(self, record: StepRecord) -> None:
        """ "step.end": the step is complete, and this is its record."""
