"""The twin's probe: the real one (hooks, records, history) on the twin's clock, each record
carrying the predicted host stages."""

from __future__ import annotations

from ..clocks import RunClock
from ..instrument.probe import Probe
from ..scheduler.record import StepRecord
from .costs import StepCosts
from .timeline import Timeline


class TwinClock(RunClock):
    """The run's clock of a twin: the timeline's virtual seconds."""

    def __init__(self, timeline: Timeline) -> None:
        super().__init__()
        self.timeline = timeline

    def now(self) -> float:
        return self.timeline.now

    def restart(self) -> None:
        self.timeline.restart()

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def wait_until(self, seconds: float) -> None:
        self.timeline.wait_for(seconds)


class TwinProbe(Probe):
    profiles = False  # no kernels to profile

    def __init__(self, timeline: Timeline, costs: StepCosts, record: str = "off", **options):
        self.timeline, self.costs = timeline, costs
        super().__init__(record, **options)

    def listen(self) -> None:
        self.inside = self.at_end = True

    def before_step(self, index: int) -> None:
        self.timeline.spend(self.costs.between_ms)

    def sample_end(self, step, batch, tokens, started, logprobs=None, prompt_logprobs=None) -> None:
        super().sample_end(step, batch, tokens, started, logprobs, prompt_logprobs)
        self.timeline.collected(self.timeline.pending[id(batch)])

    def step_end(self, record: StepRecord) -> None:
        predicted = self.timeline.pending.pop(id(record.batch))
        self.timeline.recorded(predicted)
        record.simulate(predicted.host_ms)
        super().step_end(record)

    def like(self, record: str, profile_steps) -> TwinProbe:
        """A probe for the same twin with another record level (`LLM.reconfigure`)."""
        probe = TwinProbe(
            self.timeline, self.costs, record, hooks=self.hooks, profile_steps=profile_steps
        )
        probe.roofline, probe.meta = self.roofline, self.meta
        probe.restart()
        return probe
