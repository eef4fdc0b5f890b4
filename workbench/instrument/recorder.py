"""Turning a finished step into its StepRecord (scheduler-side facts only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .record import KVState, LedgerRow, StepRecord

if TYPE_CHECKING:
    from ..scheduler.scheduler import Scheduler, StepOutcome


def build_record(sched: Scheduler, outcome: StepOutcome, events: tuple | None = None) -> StepRecord:
    launched = outcome.launched
    sampled = [r for r in outcome.rows if r.kind != "chunk"]
    token_of = {r.uid: t for r, t in zip(sampled, outcome.tokens)}
    finish_of = {req.uid: req.finish_reason for req in outcome.finished}
    rows = tuple(
        LedgerRow(
            r.uid,
            r.kind,
            r.table_idx,
            r.device_len,  # after the step: what it computed is cached ...
            r.device_len + 1,  # ... and one more token is known to the device
            r.max_device_len,
            r.extend_len,
            r.cached_tokens,
            token_of.get(r.uid),
            finish_of.get(r.uid),
        )
        for r in outcome.rows
    )
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
        rows=rows,
        admissions=tuple(outcome.admissions),
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
