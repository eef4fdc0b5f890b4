"""``mixed``: running requests decode and prefill chunks fill the rest of the budget (Sarathi)."""

from __future__ import annotations

from ..core import Admissions, Batch
from . import SchedulerState


def mixed(state: SchedulerState) -> tuple[Batch | None, Admissions]:
    running, admissions = state.running, Admissions()
    if state.queue:
        reqs, admissions = state.admit(max(0, state.max_extend_tokens - len(running)))
        if reqs and running:
            return Batch(running + reqs, "mixed", num_decode=len(running)), admissions
        if reqs:
            return Batch(reqs, "prefill"), admissions
    if running:
        return Batch(running, "decode"), admissions
    return None, admissions
