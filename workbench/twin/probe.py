"""The twin's probe: the real one (hooks, records, history) on the twin's clock.

Everything the instrumentation does is unchanged, only the clock it reads is the `Timeline`'s,
the host's collect and record stages and the loop between steps move it by their predicted
times, and each record carries the predicted host stages (not the twin's own Python's) and says
it was simulated. No profiler runs: there are no kernels.
"""

from __future__ import annotations

import contextlib

from ..history.record import StepRecord, build_record
from ..instrument.probe import Probe
from .costs import StepCosts
from .timeline import Timeline

_NULL = contextlib.nullcontext()


class TwinProbe(Probe):
    profiles = False  # no kernels to profile

    def __init__(self, timeline: Timeline, costs: StepCosts, record: str = "off", **options):
        self.timeline, self.costs = timeline, costs
        super().__init__(record, **options)
        self._predicted = None

    def clock(self) -> float:
        return self.timeline.now

    def restart(self) -> None:
        super().restart()
        self.timeline.restart()

    def wait_until(self, seconds: float) -> None:
        self.timeline.wait_for(seconds)

    def range(self, name: str):
        return _NULL

    def before_step(self, index: int) -> None:
        self.timeline.spend(self.costs.between_ms)

    def sample_end(self, step, batch, tokens, started) -> None:
        super().sample_end(step, batch, tokens, started)
        self.timeline.collected(self.timeline.pending[id(batch)])

    def step_end(self, outcome, occupancy):
        self._predicted = self.timeline.pending.pop(id(outcome.batch))
        self.timeline.recorded(self._predicted)
        return super().step_end(outcome, occupancy)

    def build_record(
        self, outcome, occupancy, events, ranks, began, rank_events=None
    ) -> StepRecord:
        predicted = self._predicted.host_ms
        return build_record(
            outcome, occupancy, None, None, None, self._last_batch, predicted_host_ms=predicted
        )

    def like(self, record: str, profile_steps) -> TwinProbe:
        """A probe for the same twin with another record level (`LLM.reconfigure`)."""
        probe = TwinProbe(
            self.timeline, self.costs, record, hooks=self.hooks, profile_steps=profile_steps
        )
        probe.cost, probe.meta = self.cost, self.meta
        return probe
