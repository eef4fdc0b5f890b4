"""What a scheduler reports as it runs: one call per hook point, in the order they fire.

The scheduler calls its observer with plain values (step indices, batches, counts) and never
looks at what the observer makes of them. This base makes nothing of them and times with the
host's clock: a scheduler watched by nobody. The instrumentation's `Probe`
(`instrument/probe.py`) builds the hook events, the step records, the history and the profiler
session from the same calls.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core import Admissions, Batch, Req
    from ..kvcache.table import TableManager
    from .outcome import Occupancy, StepOutcome

_NULL = contextlib.nullcontext()


class Observer:
    record = "off"  # what the observer keeps of each step: "off", "light" or "full"

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._paused_at: float | None = None  # when the clock stopped (None: it runs)

    def clock(self) -> float:
        """Seconds since the run started (or was reset), the time it was paused left out: the
        time axis of the run."""
        now = self._paused_at if self._paused_at is not None else time.perf_counter()
        return now - self._t0

    def restart(self) -> None:
        """A new run: the clock from zero (still paused, if it was)."""
        self._t0 = time.perf_counter()
        if self._paused_at is not None:
            self._paused_at = self._t0

    def pause(self) -> None:
        """Stop the clock: a workbench stepped by hand pauses it between calls, so the time a
        person takes between two cells is not the run's (a request added meanwhile arrives
        when the run goes on)."""
        if self._paused_at is None:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        """Start the clock again from where it stopped."""
        if self._paused_at is not None:
            self._t0 += time.perf_counter() - self._paused_at
            self._paused_at = None

    def wait_until(self, seconds: float) -> None:
        """Let the clock reach `seconds` (an idle engine waiting for a request to arrive)."""
        time.sleep(max(0.0, seconds - self.clock()))

    def range(self, name: str) -> contextlib.AbstractContextManager:
        """Around the work that ends at hook point `name` (a profiler range, when profiled)."""
        return _NULL

    def before_step(self, index: int) -> None:
        """Before the scheduler step that launches batch `index`."""

    def request_arrive(
        self,
        step: int,
        uid: int,
        prompt_len: int,
        max_tokens: int,
        seconds: float | None = None,
        source: str = "python",
    ) -> None:
        """ "request.arrive": a request is queued; it arrived at `seconds` on the run's clock
        (None: now), by `source` ("python", or "http" through the server)."""

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
        self, step: int, batch: Batch, new_pages: int, table: TableManager
    ) -> dict[int, tuple] | None:
        """ "batch.prepared": the batch's pages are allocated and its inputs built. Returns the
        page-table rows to keep with its record (None: none kept)."""
        return None

    def forward_begin(self, step: int, batch: Batch, graph: bool) -> None:
        """ "forward.begin": the forward is about to be launched (`graph`: as a CUDA graph)."""

    def forward_end(self, step: int, batch: Batch) -> None:
        """ "forward.end": the forward and the sampler are launched; ledgers moved."""

    def sample_end(self, step: int, batch: Batch, tokens: list[int], started: float) -> None:
        """ "sample.end": the batch's tokens are on the host. `started`: when collecting
        began."""

    def request_finish(self, step: int, req: Req, between_steps: bool = False) -> None:
        """ "request.finish": a request ended. `between_steps`: not by a token of a step's
        record (an abort, or its step failed)."""

    def times_device(self) -> bool:
        """Whether the step's record will read its device time (`step_end`)."""
        return False

    def step_end(self, outcome: StepOutcome, occupancy: Callable[[], Occupancy]) -> Any:
        """ "step.end": the step is complete; returns its record (None: none built).
        `occupancy` gives the queue and the KV pool after the step, when asked."""
        return None
