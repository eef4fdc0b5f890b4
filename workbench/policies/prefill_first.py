"""``prefill_first``: a prefill batch if anything can be admitted, else a decode batch."""

from __future__ import annotations

from ..core import Admissions, Batch
from . import SchedulerState


def prefill_first(state: SchedulerState) -> tuple[Batch | None, Admissions]:
    admissions = Admissions()
    if state.queue:
        reqs, admissions = state.admit(state.max_extend_tokens)
        if reqs:
            return Batch(reqs, "prefill"), admissions
    if state.running:
        return Batch(state.running, "decode"), admissions
    return None, admissions
