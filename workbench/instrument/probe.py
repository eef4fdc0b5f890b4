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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .. import validate as V
from ..config import RECORD_LEVELS
from ..core import Admissions, Batch, Req, ReqView
from ..history.history import History
from ..history.record import StepRecord, build_record
from ..profiling import StepEvents, event_cost_us, host_events_by_step
from ..scheduler.observer import Observer
from . import events as ev
from .hooks import HookRegistry
from .other_ranks import OtherRanks
from .pages import PageSnapshots
from .profiler import ProfilerSession, assign_to_steps, gc_paused
from .window import ChosenSteps, StepView, profile_window

if TYPE_CHECKING:
    from ..history.roofline import StepCost
    from ..kvcache.table import TableManager
    from ..scheduler.outcome import Occupancy, StepOutcome

_NULL = contextlib.nullcontext()


class Probe(Observer):
    """The observer that keeps what the scheduler reports: hook events, records, the history,
    the profiler session (the hook points are documented on `Observer`)."""

    profiles = True  # record="full" runs the profiler (a twin's probe: no kernels, none)

    def __init__(
        self,
        record: str = "off",
        hooks: HookRegistry | None = None,
        device: torch.device | str = "cpu",
        profile_steps: Any = None,
        cost: StepCost | None = None,
        max_profiled_steps: int | None = None,
    ) -> None:
        """`profile_steps`, `max_profiled_steps`: with record="full", the steps the profiler
        covers (`window.py`: None for all, step indices, or a predicate of the step about to
        run; a `ProfileWindow`), and at most how many. `cost`: the roofline of the engine's
        steps, for the history's steps table (None: those columns are NaN)."""
        self.record = V.choice("record", record, RECORD_LEVELS)
        self.window = profile_window(profile_steps, max_profiled_steps)
        self.hooks = hooks if hooks is not None else HookRegistry()
        self.device = torch.device(device)
        self.cost = cost
        self.history = History(self.cost, before_tables=self.read_events)
        super().__init__()  # the clock
        self._session: ProfilerSession | None = None
        self._pages = PageSnapshots()
        # while a session runs: where each step's launch and collect began (the profiler's
        # events are given to steps by them), and each profiled step's record's event list
        self._marks: list[tuple[float, int, str]] = []  # seconds, step, "launch" | "collect"
        self._early: dict[int, list] = {}  # events of a batch launched before a session ended
        self._pending: dict[int, list] = {}
        self._start_ms: dict[int, float] = {}  # a session's start in the step it chose
        self._chosen = ChosenSteps(self.window)  # the steps it chose this run
        # ended sessions not read yet: (read, marks, step -> the list its events go in)
        self._unread: list[tuple[Callable[[], list], list, dict[int, list]]] = []
        self.ranks = OtherRanks()  # tensor parallelism: what ranks 1.. report (set by LLM)
        self._last_batch: Batch | None = None  # the batch recorded last (`build_record`)
        self.meta: dict = {}  # what each history says of the run's setup (`LLM.run_meta`)

    def like(self, record: str, profile_steps) -> Probe:
        """A probe for the same engine with another record level and profile window (the
        same hooks, device and roofline; `LLM.reconfigure`)."""
        probe = Probe(record, self.hooks, self.device, profile_steps, cost=self.cost)
        probe.ranks, probe.meta = self.ranks.like(), self.meta
        return probe

    def restart(self) -> None:
        """A new run: an empty history and the clock from zero; the hooks stay."""
        if self._session is not None:
            self._session.discard()
        self.read_events()  # the old history's, for whoever still holds it
        self._marks, self._pending, self._early, self._start_ms = [], {}, {}, {}
        self._last_batch = None
        self.ranks.restart()
        self._chosen = ChosenSteps(self.window)
        self._pages = PageSnapshots()
        self.history = History(self.cost, before_tables=self.read_events)
        self.history.meta.update(self.meta)
        super().restart()  # the clock from zero

    def range(self, name: str):
        """A profiler range named after the hook point that fires at its end (while a
        profiler session runs: record="full", a step the window chose)."""
        return torch.profiler.record_function(name) if self._running else _NULL

    @property
    def _running(self) -> bool:
        return self._session is not None and self._session.running

    def before_step(self, index: int) -> None:
        """Before the scheduler step that launches batch `index`: with record="full", start a
        profiler session when a window of step indices covers it (its schedule is profiled
        too) or a chosen batch is in flight, or end the one that runs when neither is so."""
        if self.record != "full" or not self.profiles:
            return
        wanted = self._chosen.wanted_at(index)  # None: a predicate's, once it is scheduled
        if wanted:
            self._start()
        elif wanted is False and self._running:
            self.flush()

    def _start(self) -> None:
        if self._session is None:
            self._session = ProfilerSession(self.clock, self.device)
        if not self._session.running:
            self._session.start()

    def _choose(self, step: int, batch: Batch | None, occupancy) -> None:
        """The window's choice of the batch just scheduled: the session started for it, or
        ended when nothing needs it."""
        chosen = batch is not None and self._chosen.choose(
            step, lambda: StepView.of(step, batch, occupancy()), self.hooks.defer
        )
        if chosen and not self._running:  # NOTE: a start inside the step: its host time
            self._start()
            self._start_ms[step] = self._session.start_ms
        elif not chosen and self._running and not self._chosen.awaiting:
            self.flush()

    def flush(self) -> None:
        """End the profiler session, if one runs. Its events are read and given to the steps
        it covered (their records and the history's events table) when first looked for
        (`read_events`: the history's tables, `wb.step()`), not here: reading a long run's
        hundreds of thousands of kernels takes seconds of Python. The workbench calls this at
        the end of every `step`, `run` and `generate`; events are not known before."""
        if self._session is None or not self._session.running:
            return
        marks, self._marks = self._marks, []
        lists, self._pending = self._pending, {}
        # a batch launched in this session and still in flight (overlap, stepping by hand):
        # its record, built in a later step, takes the list its launch's events will fill
        self._early = {}
        for _, step, kind in marks:
            if kind == "launch" and step in self._chosen.awaiting and step not in lists:
                lists[step] = self._early[step] = StepEvents()
        self._unread.append((self._session.stop(), marks, lists))

    def read_events(self) -> None:
        """Read the ended profiler sessions' events into the steps they belong to (and, with
        tensor parallelism, the other ranks' device times of the steps recorded since and,
        while no session runs, their events of the profiled ones: `OtherRanks`)."""
        if self.ranks.read_times():
            self.history.rank_times_changed()
        unread, self._unread = self._unread, []
        with gc_paused():
            cost_ms = event_cost_us(self.device) / 1e3
            for read, marks, lists in unread:
                capture = read()
                for step, assigned in assign_to_steps(capture.events, marks).items():
                    if step in lists:
                        lists[step].extend(assigned)
                for step, count in host_events_by_step(capture.host_us, marks).items():
                    if step in lists:
                        lists[step].profiler_ms = count * cost_ms + self._start_ms.pop(step, 0.0)
        placed = not self._running and self.ranks.read_events()
        if unread or placed:
            self.history.events_changed()

    # -- hook points, in the order they fire ----------------------------------------------
    def request_arrive(
        self,
        step: int,
        uid: int,
        prompt_len: int,
        max_tokens: int,
        seconds: float | None = None,
        source: str = "python",
    ) -> None:
        seconds = self.clock() if seconds is None else seconds
        self.history.arrive(uid, step, seconds, prompt_len, max_tokens, source)
        if "request.arrive" in self.hooks:
            event = ev.RequestArrive(step, uid, prompt_len, max_tokens, source)
            self.hooks.emit("request.arrive", event)

    def cache_match_hook(self, step: int) -> Callable[[int, int, int], None] | None:
        """What admission calls on each prefix match, (uid, prompt_len, cached_len); None when
        nobody listens."""
        if "cache.match" not in self.hooks:
            return None
        emit = self.hooks.emit
        return lambda uid, prompt_len, cached_len: emit(
            "cache.match", ev.CacheMatch(step, uid, prompt_len, cached_len)
        )

    def schedule_end(
        self,
        step: int,
        batch: Batch | None,
        admissions: Admissions,
        started: float,
        occupancy: Callable[[], Occupancy] | None = None,
    ) -> None:
        """ "admit" and "reject" per decision, then "schedule.end"; with record="full", the
        profile window's choice. `started`: when the launch began (a launch that finds nothing
        to run is a window of no step for the profiler)."""
        # NOTE: the launch's mark before the choice (a session it ends covers the launch),
        # and after it too when the choice starts one
        mark, marked = (started, -1 if batch is None else step, "launch"), self._running
        if marked:
            self._marks.append(mark)
        if self.record == "full" and self.profiles:
            self._choose(step, batch, occupancy)
        if self._running and not marked:
            self._marks.append(mark)
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
            self.hooks.emit("cache.insert", ev.CacheInsert(step, uid, inserted_len, already_cached))

    def cache_evict(self, step: int, requested: int, freed: int) -> None:
        if "cache.evict" in self.hooks:
            self.hooks.emit("cache.evict", ev.CacheEvict(step, requested, freed))

    def batch_prepared(
        self, step: int, batch: Batch, new_pages: int, table: TableManager
    ) -> dict[int, tuple] | None:
        """Fires "batch.prepared"; with record="full", returns what the batch's page-table rows
        gained as slot runs (`PageSnapshots`), taken now: with overlap they change before the
        batch is collected."""
        page_rows = None
        if self.record == "full":
            page_rows = self._pages.take(table, batch.launched_views(), step)
        if "batch.prepared" in self.hooks:
            rows = batch.launched_views()
            num_tokens = sum(r.extend_len for r in rows)
            event = ev.BatchPrepared(step, batch.phase, tuple(rows), num_tokens, new_pages)
            self.hooks.emit("batch.prepared", event)
        return page_rows

    def forward_begin(self, step: int, batch: Batch, graph: bool) -> None:
        if "forward.begin" in self.hooks:
            n, bs = sum(r.extend_len for r in batch.launched_views()), batch.size
            self.hooks.emit("forward.begin", ev.ForwardBegin(step, batch.phase, bs, n, graph))

    def forward_end(self, step: int, batch: Batch) -> None:
        if "forward.end" in self.hooks:
            self.hooks.emit("forward.end", ev.ForwardEnd(step, batch.phase, tuple(batch.views())))

    def sample_end(self, step: int, batch: Batch, tokens: list[int], started: float) -> None:
        """`started`: when the collect began (where the profiler's events of it begin)."""
        if self._running:
            self._marks.append((started, step, "collect"))
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

    def times_device(self) -> bool:
        return self.record != "off" or "step.end" in self.hooks

    def step_end(
        self, outcome: StepOutcome, occupancy: Callable[[], Occupancy]
    ) -> StepRecord | None:
        """The step's record, kept in the history (record="light" or "full") and handed to
        "step.end"; None when neither wants it. `occupancy` is called only for a record."""
        if not self.times_device():
            return None
        began, clock = time.perf_counter(), outcome.launched.clock
        clock.enter("record")
        profiled = self._chosen.recorded(outcome.index) and self._running
        # its launch's events, when an earlier session saw it (overlap, stepping by hand)
        early = self._early.pop(outcome.index, None) if self._early else None
        # filled when the events are read
        events = (early if early is not None else StepEvents()) if profiled else None
        with self.range("step.end"):
            device = outcome.launched.device
            ranks = rank_events = None  # filled when the history is read
            if device.tp_size > 1 and self.ranks.present:
                ranks = self.ranks.times_of(device.launch)
                if profiled:  # the other ranks' events, and their clocks' offsets
                    rank_events = self.ranks.events_of(device.launch, events)
            record = self.build_record(outcome, occupancy(), events, ranks, began, rank_events)
            self._last_batch = outcome.batch
            if self.record != "off":
                self.history.append(record)
        if "step.end" in self.hooks:
            self.hooks.emit("step.end", record)
        if profiled:
            self._pending[outcome.index] = events
        return record

    def build_record(
        self, outcome, occupancy, events, ranks, began: float, rank_events=None
    ) -> StepRecord:
        """The step's record (`history.record.build_record`); `rank_events`: lists for the
        other ranks' events and clock offsets (`OtherRanks.events_of`)."""
        last = self._last_batch
        return build_record(outcome, occupancy, events, ranks, began, last, None, rank_events)
