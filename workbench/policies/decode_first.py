"""``decode_first``: a decode batch while any request runs; the queue waits until none does."""

from __future__ import annotations

from ..core import DECODE_FIRST, Admission, Admissions, Batch
from . import SchedulerState
from .prefill_first import prefill_first


def decode_first(state: SchedulerState) -> tuple[Batch | None, Admissions]:
    queue = state.queue
    if not state.running:
        return prefill_first(state)
    admissions = Admissions()
    if queue:
        chunked = [p for p in queue[:1] if p.chunked is not None]
        admissions.decided = [
            Admission(p.uid, False, DECODE_FIRST, 0, p.chunked.cached_len) for p in chunked
        ]
        admissions.behind, admissions.behind_reason = queue[len(chunked) :], DECODE_FIRST
    return Batch(state.running, "decode"), admissions
