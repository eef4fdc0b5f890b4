"""The probe: everything a step reports, kept beside the step.

The scheduler calls one method per hook point, named after it (`schedule_end` for
"schedule.end"), with plain values: step indices, batches, ledgers, counts. The probe owns what
follows from them: the hook events (built only when someone listens), the run's history and
step records (at the record level asked for), the page-table snapshots and the profiler of
record="full", and the clock every record is timed on. With record="off" and no hooks, each
call is a membership test and a return.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from .. import validate as V
from ..config import RECORD_LEVELS
from ..core import Admissions, Batch, Req, ReqView
from . import events as ev
from .history import History
from .hooks import HookRegistry
from .profiler import StepProfiler
from .record import KVState, StepRecord

if TYPE_CHECKING:
    from ..kvcache.table import TableManager
    from ..scheduler.outcome import Occupancy, StepOutcome

_NULL = contextlib.nullcontext()


class Probe:
    def __init__(
        self,
        record: str = "off",
        hooks: HookRegistry | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.record = V.choice("record", record, RECORD_LEVELS)
        self.hooks = hooks if hooks is not None else HookRegistry()
        self.device = torch.device(device)
        self.history = History()
        self._t0 = time.perf_counter()
        self._events: tuple | None = None  # the profiled step's events, until its record

    def clock(self) -> float:
        """Seconds since the run started (or was reset): the time axis of the records."""
        return time.perf_counter() - self._t0

    def restart(self) -> None:
        """A new run: an empty history and the clock from zero; the hooks stay."""
        self.history = History()
        self._t0 = time.perf_counter()

    def range(self, name: str):
        """A profiler range named after the hook point that fires at its end (record="full")."""
        return torch.profiler.record_function(name) if self.record == "full" else _NULL

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Around one scheduler step: torch.profiler with record="full"."""
        if self.record != "full":
            yield
            return
        with StepProfiler(self.clock, self.device) as prof:
            yield
        self._events = prof.events()

    # -- hook points, in the order they fire ----------------------------------------------
    def request_arrive(self, step: int, uid: int, prompt_len: int, max_tokens: int) -> None:
        self.history.arrive(uid, step, self.clock(), prompt_len, max_tokens)
        if "request.arrive" in self.hooks:
            self.hooks.emit("request.arrive", ev.RequestArrive(step, uid, prompt_len, max_tokens))

    def cache_match_hook(self, step: int) -> Callable[[int, int, int], None] | None:
        """What admission calls on each prefix match, (uid, prompt_len, cached_len); None when
        nobody listens."""
        if "cache.match" not in self.hooks:
            return None
        emit = self.hooks.emit
        return lambda uid, prompt_len, cached_len: emit(
            "cache.match", ev.CacheMatch(step, uid, prompt_len, cached_len)
        )

    def schedule_end(self, step: int, batch: Batch | None, admissions: Admissions) -> None:
        """ "admit" and "reject" per decision, then "schedule.end"."""
        hooks = self.hooks
        if "admit" in hooks and batch is not None:
            by_uid = {r.uid: r for r in batch.reqs}
            for a in admissions.decided:  # the requests behind were all refused
                if a.admitted:
                    req = by_uid[a.uid]
                    kind = ReqView.of(req, decoding=False).kind
                    event = ev.Admit(step, a.uid, kind, a.cached_len, a.extend_len, req.table_idx)
                    hooks.emit("admit", event)
        if "reject" in hooks:
            for a in admissions:
                if not a.admitted:
                    hooks.emit("reject", ev.Reject(step, a.uid, a.reason))
        if "schedule.end" in hooks and (batch is not None or admissions):
            admitted = sum(a.admitted for a in admissions.decided)
            phase = None if batch is None else batch.phase
            uids = () if batch is None else tuple(r.uid for r in batch.reqs)
            event = ev.ScheduleEnd(step, phase, uids, admitted, len(admissions) - admitted)
            hooks.emit("schedule.end", event)

    def cache_insert(self, step: int, uid: int, inserted_len: int, already_cached: int) -> None:
        if "cache.insert" in self.hooks:
            event = ev.CacheInsert(step, uid, inserted_len, already_cached)
            self.hooks.emit("cache.insert", event)

    def cache_evict(self, step: int, requested: int, freed: int) -> None:
        if "cache.evict" in self.hooks:
            self.hooks.emit("cache.evict", ev.CacheEvict(step, requested, freed))

    def batch_prepared(
        self, step: int, batch: Batch, rows: list[ReqView], new_pages: int, table: TableManager
    ) -> dict[int, tuple[int, ...]] | None:
        """Fires "batch.prepared"; with record="full", returns the batch's page-table rows,
        snapshot now: with overlap they change before the batch is collected."""
        page_rows = None
        if self.record == "full":
            pages = table.page_table_host
            page_rows = {
                r.table_idx: tuple(pages[r.table_idx, : r.device_len].tolist()) for r in rows
            }
        if "batch.prepared" in self.hooks:
            num_tokens = sum(r.extend_len for r in rows)
            event = ev.BatchPrepared(step, batch.phase, tuple(rows), num_tokens, new_pages)
            self.hooks.emit("batch.prepared", event)
        return page_rows

    def forward_begin(self, step: int, batch: Batch, rows: list[ReqView], graph: bool) -> None:
        if "forward.begin" in self.hooks:
            num_tokens = sum(r.extend_len for r in rows)
            event = ev.ForwardBegin(step, batch.phase, batch.size, num_tokens, graph)
            self.hooks.emit("forward.begin", event)

    def forward_end(self, step: int, batch: Batch) -> None:
        if "forward.end" in self.hooks:
            self.hooks.emit("forward.end", ev.ForwardEnd(step, batch.phase, tuple(batch.views())))

    def sample_end(self, step: int, batch: Batch, tokens: list[int]) -> None:
        if "sample.end" in self.hooks:
            uids = tuple(r.uid for r in batch.sampled_reqs)
            self.hooks.emit("sample.end", ev.SampleEnd(step, uids, tuple(tokens)))

    def request_finish(self, step: int, req: Req, between_steps: bool = False) -> None:
        """A request ended. `between_steps`: not by a token of a step's record (an abort, or
        its step failed), so the history is told here."""
        if between_steps:
            self.history.abort(req.uid, step, self.clock(), req.finish_reason)
        if "request.finish" in self.hooks:
            event = ev.RequestFinish(
                step, req.uid, req.finish_reason, req.prompt_len, req.cached_tokens, req.output_len
            )
            self.hooks.emit("request.finish", event)

    def step_end(
        self, outcome: StepOutcome, occupancy: Callable[[], Occupancy]
    ) -> StepRecord | None:
        """The step's record, kept in the history (record="light" or "full") and handed to
        "step.end"; None when neither wants it. `occupancy` is called only when a record is
        built."""
        events, self._events = self._events, None
        if self.record == "off" and "step.end" not in self.hooks:
            return None
        with self.range("step.end"):
            record = build_record(outcome, occupancy(), events)
            if self.record != "off":
                self.history.append(record)
        if "step.end" in self.hooks:
            self.hooks.emit("step.end", record)
        return record


def build_record(
    outcome: StepOutcome, occupancy: Occupancy, events: tuple | None = None
) -> StepRecord:
    launched, o = outcome.launched, occupancy
    in_use = o.kv_total - o.kv_free - o.kv_evictable
    return StepRecord(
        step=outcome.index,
        phase=outcome.batch.phase,
        _launched=tuple([tuple(r) for r in outcome.rows]),
        _tokens=tuple(outcome.tokens),
        _finishes=tuple((req.uid, req.finish_reason) for req in outcome.finished),
        _admissions=tuple([tuple(a) for a in outcome.admissions.decided]),
        _behind=tuple([p.uid for p in outcome.admissions.behind]),
        _behind_reason=outcome.admissions.behind_reason,
        queue_len=o.queue_len,
        running=o.running,
        kv=KVState(free=o.kv_free, evictable=o.kv_evictable, in_use=in_use, total=o.kv_total),
        free_slots=o.free_slots,
        padded_size=launched.padded_size,
        cuda_graph=launched.cuda_graph,
        overlapped=launched.overlapped,
        launched_at=launched.launched_at,
        completed_at=outcome.completed_at,
        device_ms=launched.device.timer.elapsed_ms(),
        host_ms=launched.launch_ms + outcome.collect_ms,
        wait_ms=outcome.wait_ms,
        page_rows=launched.page_rows,
        events=events,
    )
