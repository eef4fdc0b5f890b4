"""What a step's times mean, defined once. The steps table carries these columns and every view
reads them (the dashboard, `compare_table`, `compare_summary`, the report, a twin's runs), so no
two views can disagree about a step.

- ``device_ms``: the device's time for the step's forward and sampling. On a GPU, CUDA events
  around them. On the CPU there is no device apart from the host: the forward and the sampling
  run on the host's own cores, and ``device_ms`` is their wall time ("device" then means the
  forward and sampling; `DEVICE_MEANING` says so in words).
- ``host_ms``: the host's time for the step, every stage (schedule ... record).
- ``host_work_ms``: the host's own work, the device's left out: ``host_ms`` on a GPU (it only
  enqueues the forward), ``host_ms - device_ms`` on the CPU (the forward and sampling are the
  device's work there, done by the host's cores).
- ``host_bound``: the host's own work took longer than the device's (``host_work_ms >
  device_ms``). With overlap a step takes the longer of the two, so the host set its pace.
- ``span_ms``: the step's share of the run's time, from the previous step's completion (or its
  own launch, when it came later: the engine waited for a request) to its own completion. With
  overlap the steps' launch-to-completion walls overlap; their spans do not, and they add up to
  the run's time.
- ``idle_ms``: the part of the span the device spent on nothing: ``span_ms - device_ms``, at
  least 0. On the CPU that is the host's own work between two forwards.
- device busy: ``device_ms`` over ``span_ms``, summed over the steps (`device_busy_pct`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

DEVICE_MEANING = {
    True: "on the CPU the device's work is the forward and sampling, run on the host's cores",
    False: "the device's work is the forward and sampling on the GPU, between CUDA events",
}
# the host stages (`stages.HOST_STAGES`) that are the device's work on the CPU, where the host's
# cores run the forward and the sampling themselves
DEVICE_STAGES = ("forward", "sample")


def host_work_ms(host_ms: float, device_ms: float, device_on_host: bool) -> float:
    """The host's own work in a step (see the module)."""
    if device_on_host:
        return max(host_ms - device_ms, 0.0)
    return host_ms


def is_host_bound(host_ms: float, device_ms: float, device_on_host: bool) -> bool:
    return host_work_ms(host_ms, device_ms, device_on_host) > device_ms


def add_timing_columns(steps: pd.DataFrame, device_on_host: bool) -> pd.DataFrame:
    """`steps` with ``span_ms`` and ``idle_ms`` added (in place), and ``host_work_ms`` and
    ``host_bound`` where it lacks them (a run saved before they were recorded: from
    `device_on_host`; NA where the run has no host times)."""
    import pandas as pd

    device = steps.device_ms.to_numpy(dtype=float)
    if "host_work_ms" not in steps:
        host = steps.host_ms.to_numpy(dtype=float) if "host_ms" in steps else np.nan + device
        work = np.maximum(host - device, 0.0) if device_on_host else host
        known = ~np.isnan(work)
        steps["host_work_ms"] = work
        steps["host_bound"] = pd.array(np.where(known, work > device, None), dtype="boolean")
    steps["span_ms"] = step_spans_ms(steps)
    steps["idle_ms"] = np.maximum(steps.span_ms.to_numpy(dtype=float) - device, 0.0)
    return steps


def step_spans_ms(steps: pd.DataFrame) -> np.ndarray:
    """Each step's span (see the module), in the table's order of steps."""
    if steps.empty:
        return np.zeros(0)
    launched = steps.launched_at.to_numpy(dtype=float)
    completed = steps.completed_at.to_numpy(dtype=float)
    previous = np.concatenate([[-math.inf], np.maximum.accumulate(completed)[:-1]])
    return (completed - np.maximum(previous, launched)).clip(min=0) * 1e3


class RunTiming(NamedTuple):
    """A run's steps by the definitions above."""

    steps: int
    host_bound: int | None  # None: the run recorded no host times
    device_ms: float
    span_ms: float
    idle_ms: float
    device_on_host: bool

    @property
    def device_busy_pct(self) -> float:
        return 100 * self.device_ms / self.span_ms if self.span_ms > 0 else math.nan


def run_timing(steps: pd.DataFrame, device_on_host: bool) -> RunTiming:
    """The run's host-bound steps, device time, span and idle time, from a steps table with the
    columns of `add_timing_columns` (added here when it lacks them)."""
    if "host_bound" not in steps or "span_ms" not in steps:
        steps = add_timing_columns(steps.copy(), device_on_host)
    known = steps.host_bound.notna()
    return RunTiming(
        steps=len(steps),
        host_bound=int(steps.host_bound[known].astype(bool).sum()) if known.any() else None,
        device_ms=float(steps.device_ms.sum()),
        span_ms=float(steps.span_ms.sum()),
        idle_ms=float(steps.idle_ms.sum()),
        device_on_host=device_on_host,
    )


def device_on_host(history) -> bool:
    """Whether the run's forward ran on the host's cores (a CPU engine; a twin stands for the
    GPU it was calibrated on, so its runs are not)."""
    meta = getattr(history, "meta", {}) or {}
    if meta.get("simulated"):
        return False
    return str(meta.get("device", "")).startswith("cpu")
