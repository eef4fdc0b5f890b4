"""``mixed``: every running request decodes (a token of the budget each) and prefill chunks fill
the rest of the token budget, in one batch: stall-free batching, as in Sarathi-Serve."""

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
