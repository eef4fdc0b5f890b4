"""Turning a finished step into its StepRecord (scheduler-side facts only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .record import KVState, StepRecord

if TYPE_CHECKING:
    from ..scheduler.scheduler import Scheduler, StepOutcome


def build_record(sched: Scheduler, outcome: StepOutcome, events: tuple | None = None) -> StepRecord:
    launched = outcome.launched
    cache = sched.cache
    kv = KVState(
        free=cache.free_size,
        evictable=cache.evictable_size,
        in_use=cache.total_size - cache.free_size - cache.evictable_size,
        total=cache.total_size,
    )
    return StepRecord(
        step=outcome.index,
        phase=outcome.batch.phase,
        _launched=tuple([tuple(r) for r in outcome.rows]),
        _tokens=tuple(outcome.tokens),
        _finishes=tuple((req.uid, req.finish_reason) for req in outcome.finished),
        _admissions=tuple([tuple(a) for a in outcome.admissions.decided]),
        _behind=tuple([p.uid for p in outcome.admissions.behind]),
        _behind_reason=outcome.admissions.behind_reason,
        queue_len=len(sched.prefill.queue),
        running=len(sched.decode.running),
        kv=kv,
        free_slots=sched.table.available_size,
        padded_size=launched.padded_size,
        cuda_graph=launched.cuda_graph,
        overlapped=launched.overlapped,
        launched_at=launched.launched_at,
        completed_at=outcome.completed_at,
        device_ms=launched.timer.elapsed_ms(),
        host_ms=launched.launch_ms + outcome.collect_ms,
        wait_ms=outcome.wait_ms,
        page_rows=launched.page_rows,
        events=events,
    )
