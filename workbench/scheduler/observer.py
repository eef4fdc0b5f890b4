"""What a scheduler reports as it runs: one call per hook point, in the order they fire.

Inside a step it calls only while `inside` is True, so an unwatched step runs none of this.
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
    inside = False  # hears of a step's inside (every hook point below)
    at_end = False  # hears of a step's end (`step_end`)
    profiling = False  # a profiler session runs: stages run in profiler ranges
    clock: RunClock

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
        """ "request.arrive": a request is queued (at `seconds` on the run's clock)."""

    def cache_match_hook(self, step: int) -> Callable[[int, int, int], None] | None:
        """Called on each prefix match with (uid, prompt_len, cached_len); None: nobody listens."""
        return None

    def schedule_end(
        self,
        step: int,
        batch: Batch | None,
        admissions: Admissions,
        started: float,
        occupancy: Callable[[], Occupancy] | None = None,
    ) -> None:
        """ "admit" and "reject" per decision, then "schedule.end"."""

    def cache_insert(self, step: int, uid: int, inserted_len: int, already_cached: int) -> None:
        """ "cache.insert": a request's full pages went to the prefix cache."""

    def cache_evict(self, step: int, requested: int, freed: int) -> None:
        """ "cache.evict": unlocked cached pages were freed for an allocation."""

    def batch_prepared(
        self, step: int, batch: Batch, new_pages: int, table: TableManager, launch: Launch
    ) -> dict[int, tuple] | None:
        """ "batch.prepared", then "forward.begin"; returns page-table rows for the record."""
        return None

    def forward_end(self, step: int, batch: Batch) -> None:
        """ "forward.end": the forward and the sampler are launched."""

    def sample_end(
        self,
        step: int,
        batch: Batch,
        tokens: list[int],
        started: float,
        logprobs=None,
        prompt_logprobs=None,
    ) -> None:
        """ "sample.end": the batch's tokens are on the host; `logprobs`, per request, its
        `Req.logprobs` entry where it asked (None: none did); `prompt_logprobs`, per request,
        its prompt's where it asked and this is its first token (None: none)."""

    def moe_route(self, step: int, launch: Launch) -> None:
        """ "moe.route": an MoE model's step is done; `launch.host_routing()` is its routing."""

    def request_finish(
        self, step: int, req: Req, between_steps: bool = False, seconds: float = 0.0
    ) -> None:
        """ "request.finish": a request ended (`between_steps`: by an abort or a failed step)."""

    def step_end(self, record: StepRecord) -> None:
        """ "step.end": the step is complete, and this is its record."""
