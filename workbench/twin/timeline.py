"""The twin's clock: virtual seconds, moved only by predicted host and device times.

The twin's own Python never reaches the clock (a simulator whose host time leaked into its clock
predicts its own speed, not the engine's). The scheduler runs unchanged and reads this clock
where a real one reads the host's; what moves it:

- a launch (`launch`): the host's schedule, prepare and plan stages, then the forward is
  enqueued: the device starts it when it is free (with overlap, the step before may still
  run), the host goes on with its forward, sample and share stages;
- a wait for a step's tokens (`wait_for`): to the time the device finishes it;
- the collect and record stages (`spend`), and the loop's time between two steps;
- an idle engine waiting for the next arrival: straight to it.

So a step's wall time is what the real pipeline gives: with overlap, the host's launch of the
next step against the device's run of this one, and a host-bound step shows as host-bound.
"""

from __future__ import annotations

from typing import NamedTuple

from ..clocks import HOST_STAGES

_LAUNCH = HOST_STAGES.index("forward")  # stages before it run before the device starts
_COLLECT = HOST_STAGES.index("collect")


class Predicted(NamedTuple):
    """A step's predicted times and when the device finishes it."""

    device_ms: float
    host_ms: tuple[float, ...]  # per stage, `HOST_STAGES` order
    done: float  # virtual seconds


class Timeline:
    def __init__(self) -> None:
        self.now = 0.0  # virtual seconds since the run started
        self.device_free = 0.0  # when the device finishes what it was given
        self.pending: dict[int, Predicted] = {}  # id(batch) -> its times, until recorded

    def restart(self) -> None:
        self.now = self.device_free = 0.0
        self.pending.clear()

    def launch(self, device_ms: float, host_ms: tuple[float, ...]) -> Predicted:
        """A step launched now: the host's launch stages, the device's run of it."""
        self.now += sum(host_ms[:_LAUNCH]) / 1e3
        start = max(self.now, self.device_free)
        self.now += sum(host_ms[_LAUNCH:_COLLECT]) / 1e3
        self.device_free = start + device_ms / 1e3
        return Predicted(device_ms, host_ms, self.device_free)

    def wait_for(self, seconds: float) -> None:
        self.now = max(self.now, seconds)

    def spend(self, ms: float) -> None:
        self.now += ms / 1e3

    def collected(self, predicted: Predicted) -> None:
        """The host processed the step's tokens (its collect stage)."""
        self.spend(predicted.host_ms[_COLLECT])

    def recorded(self, predicted: Predicted) -> None:
        """The host recorded the step (its record stage)."""
        self.spend(sum(predicted.host_ms[_COLLECT + 1 :]))
