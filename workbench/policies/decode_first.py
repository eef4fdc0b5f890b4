"""``decode_first``: a decode batch while any request runs; waiting requests are admitted only when
none does (each is refused with the reason ``decode_first`` until then)."""

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
        # a prompt part-way through its chunks heads the queue; its decision carries its progress
        chunked = [p for p in queue[:1] if p.chunked is not None]
        admissions.decided = [
            Admission(p.uid, False, DECODE_FIRST, 0, p.chunked.cached_len) for p in chunked
        ]
        admissions.behind, admissions.behind_reason = queue[len(chunked) :], DECODE_FIRST
    return Batch(state.running, "decode"), admissions
