"""The run history's tables: one NamedTuple per table, whose fields are its columns, and the rows
built from StepRecords. Rows are built by keyword, so a column and its value cannot drift apart.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from ..clocks import HOST_STAGES
from ..timing import add_timing_columns
from .frames import add_rank_columns, rounded, text_as_string
from .rank_skew import add_skew_columns
from .request_table import requests_table
from .roofline import NO_BOUND
from .routing import RoutingColumns, expert_imbalance, experts_touched

if TYPE_CHECKING:
    import pandas as pd

    from ..scheduler.record import StepRecord
    from .roofline import Roofline


class StepRow(NamedTuple):
    """One scheduler step: its batch by kind, the queue, the KV pool, timings and roofline."""

    step: int
    phase: str
    batch_size: int
    padded_size: int
    num_tokens: int
    prefill_tokens: int
    chunk_tokens: int
    decode_tokens: int
    padding_tokens: int
    sampled: int  # requests that got a token (all but prompt chunks)
    decode_context: int  # KV tokens the decodes' attention read, new tokens included
    prefill_pairs: int  # causal (query, key) pairs of the prompt tokens computed
    admitted: int
    waiting_reasons: str  # comma-separated, sorted
    queue_len: int
    running: int
    kv_free: int
    kv_evictable: int
    kv_in_use: int
    kv_total: int
    free_slots: int
    cuda_graph: bool
    tp_size: int  # processes the forward ran on (tensor parallelism)
    overlapped: bool
    launched_at: float
    completed_at: float
    wall_ms: float
    device_ms: float
    host_ms: float
    wait_ms: float
    # host_ms by stage (`clocks.HOST_STAGES`)
    host_schedule_ms: float
    host_prepare_ms: float
    host_plan_ms: float
    host_forward_ms: float
    host_sample_ms: float
    host_share_ms: float
    host_collect_ms: float
    host_record_ms: float
    # `timing.py`: the host's own work and whether it outlasted the device's
    host_work_ms: float
    host_bound: bool
    bytes_read: float  # weights once (an MoE's: the experts touched), KV read and written
    flops: float
    bound_ms: float  # the roofline's time for the step; NaN without a device spec
    achieved_gbps: float  # bytes_read / device_ms; NaN where device_ms is 0
    # an MoE model's routing (`routing.py`), NaN for a dense model: the mean over MoE layers of
    # the experts given at least one token, and of the most tokens an expert got over the mean
    experts_touched: float
    expert_imbalance: float
    simulated: bool  # timed by a twin's step costs (`workbench.twin`), not measured
    profiled: bool  # record="full": the profiler recorded it
    profiler_ms: float  # host time the profiler added, by its estimate (`_profiler_ms`)


class LedgerEntry(NamedTuple):
    """One request of one step's batch."""

    step: int
    uid: int
    kind: str
    table_idx: int
    cached_len: int
    device_len: int
    max_device_len: int
    extend_len: int
    remain_len: int
    cached_tokens: int
    token: int | None
    finish: str | None


class AdmissionRow(NamedTuple):
    """One admission decision: admitted, or the reason the request waited."""

    step: int
    uid: int
    admitted: bool
    reason: str | None
    extend_len: int
    cached_len: int


class EventRow(NamedTuple):
    """One profiler event of one rank, on rank 0's clock."""

    step: int
    rank: int
    name: str
    category: str
    track: str
    start_us: float
    duration_us: float


class PageRow(NamedTuple):
    """A run of consecutive KV slots a page-table row gained in a step, listed from `since`."""

    step: int
    uid: int
    table_idx: int
    pos_start: int
    pos_end: int
    slot_start: int
    since: int


class TableRows:
    """The tables' rows so far; a live history adds only the records since its last tables."""

    def __init__(self, roofline: Roofline | None = None) -> None:
        self.roofline = roofline
        self.count = 0
        self.last: StepRecord | None = None  # tells a history that started over
        # NOTE: plain tuples, not NamedTuples: the garbage collector stops tracking those
        self.steps: list[tuple] = []
        self.ledger: list[tuple] = []
        self.admissions: dict[str, list] = {c: [] for c in AdmissionRow._fields}  # by column
        self.events: list[tuple] = []
        self.pages: list[tuple] = []
        self.routing = RoutingColumns()
        self.rank_ms: dict[int, list[float]] = {}  # step -> ranks 1..'s device ms
        self.rank_clock_ms: dict[int, list[float]] = {}  # step -> ranks 1..'s clock offsets

    def follows(self, records: list[StepRecord]) -> bool:
        n = self.count
        return n <= len(records) and (n == 0 or records[n - 1] is self.last)

    def add(self, rec: StepRecord) -> None:
        self.count, self.last = self.count + 1, rec
        rows = rec.rows  # built on access: once per record
        # NOTE: a long queue's group refusal (`behind`) goes in as whole columns
        decided, behind, reason = rec.admission_parts
        _add_admissions(self.admissions, rec.step, decided, behind, reason)
        reasons = {reason for _, admitted, reason, _, _ in decided if not admitted}
        if behind:
            reasons.add(reason)
        by_kind = self._add_ledger(rec, rows)
        self._add_step(rec, rows, by_kind, decided, reasons)
        if rec.rank_device_ms is not None:
            self.rank_ms[rec.step] = rec.rank_device_ms
        if rec.rank_clock_ms is not None:
            self.rank_clock_ms[rec.step] = rec.rank_clock_ms
        for rank, events in rec.events_by_rank:
            # NOTE: `EventRow`'s fields in order, without building one per event
            head = (rec.step, rank)
            self.events.extend(head + event for event in events)
        if rec.page_rows:
            self._add_pages(rec, rows)
        if rec.routing is not None:
            self.routing.add(rec.step, rec.moe_layers, rec.routing)

    def _add_ledger(self, rec: StepRecord, rows) -> dict[str, int]:
        by_kind = {"prefill": 0, "chunk": 0, "decode": 0}
        sampled = context = pairs = 0
        for r in rows:
            new = r.extend_len
            by_kind[r.kind] += new
            if r.kind == "decode":
                context += r.cached_len  # after the step: the context it read, new token too
            else:
                pairs += new * (r.cached_len - new) + new * (new + 1) // 2
            sampled += r.kind != "chunk"
            entry = LedgerEntry(
                step=rec.step,
                uid=r.uid,
                kind=r.kind,
                table_idx=r.table_idx,
                cached_len=r.cached_len,
                device_len=r.device_len,
                max_device_len=r.max_device_len,
                extend_len=r.extend_len,
                remain_len=r.max_device_len - r.device_len,
                cached_tokens=r.cached_tokens,
                token=r.token,
                finish=r.finish,
            )
            self.ledger.append(tuple(entry))
        by_kind.update(sampled=sampled, decode_context=context, prefill_pairs=pairs)
        return by_kind

    def _add_step(self, rec: StepRecord, rows, by_kind: dict, decided, reasons: set) -> None:
        bound = NO_BOUND if self.roofline is None else self.roofline.of_step(rows, rec.routing)
        device_ms = rec.device_ms
        split = rec.host_stage_ms or (math.nan,) * len(HOST_STAGES)
        step = StepRow(
            step=rec.step,
            phase=rec.phase,
            batch_size=rec.size,
            padded_size=rec.padded_size,
            num_tokens=rec.num_tokens,
            prefill_tokens=by_kind["prefill"],
            chunk_tokens=by_kind["chunk"],
            decode_tokens=by_kind["decode"],
            padding_tokens=rec.padding_tokens,
            sampled=by_kind["sampled"],
            decode_context=by_kind["decode_context"],
            prefill_pairs=by_kind["prefill_pairs"],
            admitted=sum(admitted for _, admitted, _, _, _ in decided),
            waiting_reasons=",".join(sorted(reasons)),
            queue_len=rec.queue_len,
            running=rec.running,
            kv_free=rec.kv.free,
            kv_evictable=rec.kv.evictable,
            kv_in_use=rec.kv.in_use,
            kv_total=rec.kv.total,
            free_slots=rec.free_slots,
            cuda_graph=rec.cuda_graph,
            tp_size=rec.tp_size,
            overlapped=rec.overlapped,
            launched_at=rec.launched_at,
            completed_at=rec.completed_at,
            wall_ms=rec.wall_ms,
            device_ms=device_ms,
            host_ms=rec.host_ms,
            wait_ms=rec.wait_ms,
            **{f"host_{stage}_ms": ms for stage, ms in zip(HOST_STAGES, split)},
            host_work_ms=rec.host_work_ms,
            host_bound=rec.host_bound,
            bytes_read=bound.bytes_read,
            flops=bound.flops,
            bound_ms=bound.bound_ms,
            achieved_gbps=bound.bytes_read / device_ms / 1e6 if device_ms > 0 else math.nan,
            experts_touched=experts_touched(rec.routing),
            expert_imbalance=expert_imbalance(rec.routing),
            simulated=rec.simulated,
            profiled=rec.events is not None,
            profiler_ms=_profiler_ms(rec),
        )
        self.steps.append(tuple(step))

    def _add_pages(self, rec: StepRecord, rows) -> None:
        for r in rows:
            since, runs = rec.page_rows[r.table_idx]
            for pos_start, pos_end, slot_start in runs:
                page = PageRow(
                    step=rec.step,
                    uid=r.uid,
                    table_idx=r.table_idx,
                    pos_start=pos_start,
                    pos_end=pos_end,
                    slot_start=slot_start,
                    since=since,
                )
                self.pages.append(tuple(page))

    def frames(self, arrivals: dict, aborts: dict) -> dict[str, pd.DataFrame]:
        import pandas as pd

        admissions = self.admissions
        frames = {
            "steps": pd.DataFrame(self.steps, columns=StepRow._fields),
            "ledger": pd.DataFrame(self.ledger, columns=LedgerEntry._fields).astype(
                {"token": "Int64"}
            ),
            "admissions": pd.DataFrame(
                admissions if admissions["step"] else [], columns=AdmissionRow._fields
            ),
            "events": pd.DataFrame(self.events, columns=EventRow._fields),
            "pages": pd.DataFrame(self.pages, columns=PageRow._fields),
            "routing": self.routing.frame(),
        }
        add_rank_columns(frames["steps"], self.rank_ms)
        add_rank_columns(frames["steps"], self.rank_clock_ms, "clock_offset_ms_rank")
        add_skew_columns(frames["steps"], frames["events"])
        add_timing_columns(frames["steps"], device_on_host=False)
        frames["requests"] = requests_table(frames["steps"], frames["ledger"], arrivals, aborts)
        return {name: text_as_string(rounded(frame)) for name, frame in frames.items()}


def _add_admissions(
    columns: dict[str, list], step: int, decided: tuple, behind: tuple, behind_reason: str
) -> None:
    for uid, admitted, reason, extend_len, cached_len in decided:
        row = AdmissionRow(
            step=step,
            uid=uid,
            admitted=admitted,
            reason=reason,
            extend_len=extend_len,
            cached_len=cached_len,
        )
        for name, value in zip(AdmissionRow._fields, row):
            columns[name].append(value)
    n = len(behind)
    if n:
        columns["step"].extend([step] * n)
        columns["uid"].extend(behind)
        columns["admitted"].extend([False] * n)
        columns["reason"].extend([behind_reason] * n)
        columns["extend_len"].extend([0] * n)
        columns["cached_len"].extend([0] * n)


def _profiler_ms(rec: StepRecord) -> float:
    """The host time the profiler added to a step, by its estimate: a profiled step's (its
    events and the session's start), or what ending a session took in a step it did not
    profile (NaN: neither)."""
    if rec.events is not None:
        return getattr(rec.events, "profiler_ms", math.nan)
    return rec.profiler_stop_ms or math.nan
