"""The twin's clock: virtual seconds, moved only by predicted host and device times.

The twin's own Python never reaches the clock, or it would predict its own speed. With overlap,
a step's device run starts when the device is free, while the host launches the next.
"""

from __future__ import annotations

from typing import NamedTuple

from ..clocks import HOST_STAGES

_LAUNCH = HOST_STAGES.index("forward")
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
        self.spend(predicted.host_ms[_COLLECT])

    def recorded(self, predicted: Predicted) -> None:
        self.spend(sum(predicted.host_ms[_COLLECT + 1 :]))
