"""The probe: everything a step reports, kept beside the step.

The scheduler calls one method per hook point, named after it (`schedule_end` for
"schedule.end"), with plain values: step indices, batches, ledgers, counts; at a step's start and
end always, inside it only while the probe asks to (`inside`: record="full", or a hook on a point
inside a step). The probe owns what follows from them: the hook events (built only when someone
listens), the run's history (at the record level asked for), the page-table snapshots and the
profiler of record="full".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .. import validate as V
from ..clocks import RunClock
from ..config import RECORD_LEVELS
from ..core import Admissions, Batch, Req, ReqView
from ..history.history import History
from ..profiling import StepEvents
from ..scheduler.observer import Observer
from ..scheduler.record import StepRecord
from . import events as ev
from .hooks import HookRegistry
from .other_ranks import OtherRanks
from .pages import PageSnapshots
from .profiler import ProfilerSession, SessionEvents
from .window import ChosenSteps, StepView, profile_window

if TYPE_CHECKING:
    from ..engine.engine import Launch
    from ..history.roofline import StepCost
    from ..kvcache.table import TableManager
    from ..scheduler.record import Occupancy


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
        self.clock = RunClock()  # the scheduler's, once one is built on this probe
        self.ranks = OtherRanks()  # tensor parallelism: what ranks 1.. report (set by LLM)
        self.meta: dict = {}  # what each history says of the run's setup (`LLM.run_meta`)
        self.profiling = False  # a profiler session runs
        self._session: ProfilerSession | None = None
        self.restart()
        self.hooks.on_change = self.listen
        self.listen()

    def listen(self) -> None:
        """What the scheduler tells this probe: a step's inside (hook points, profiler marks)
        with record="full" or a hook on a point inside a step; its end with a record level or
        a "step.end" hook."""
        self.inside = self.record == "full" or self.hooks.inside
        self.at_end = self.record != "off" or self.hooks.at_end

    def like(self, record: str, profile_steps) -> Probe:
        """A probe for the same engine with another record level and profile window (the
        same hooks, device and roofline; `LLM.reconfigure`)."""
        probe = Probe(record, self.hooks, self.device, profile_steps, cost=self.cost)
        probe.ranks, probe.meta = self.ranks.like(), self.meta
        probe.restart()
        return probe

    def restart(self) -> None:
        """A new run: an empty history; the hooks stay."""
        if self._session is not None:
            self._session.discard()
            self.profiling = self.ranks.session_running = False
        if getattr(self, "history", None) is not None:
            self.history.fill_in()  # the old history's, for whoever still holds it
        self._marks: list[tuple[float, int, str]] = []  # seconds, step, "launch" | "collect"
        # while a session runs: where each step's launch and collect began (the profiler's
        # events are given to steps by them), and each profiled step's record's event list
        self._early: dict[int, list] = {}  # events of a batch launched before a session ended
        self._pending: dict[int, list] = {}
        self._start_ms: dict[int, float] = {}  # a session's start in the step it chose
        self._chosen = ChosenSteps(self.window)  # the steps it chose this run
        self._pages = PageSnapshots()
        self.ranks.restart()
        self.history = History(self.cost, self.ranks if self.ranks.present else None)
        self.history.meta.update(self.meta)

    def before_step(self, index: int) -> None:
        """Before the scheduler step that launches batch `index`: with record="full", start a
        profiler session when a window of step indices covers it (its schedule is profiled
        too) or a chosen batch is in flight, or end the one that runs when neither is so."""
        if self.record != "full" or not self.profiles:
            return
        wanted = self._chosen.wanted_at(index)  # None: a predicate's, once it is scheduled
        if wanted:
            self._start()
        elif wanted is False and self.profiling:
            self.flush()

    def _start(self) -> None:
        if self._session is None:
            self._session = ProfilerSession(self.clock.now, self.device)
        if not self._session.running:
            self._session.start()
        self.profiling = self.ranks.session_running = True

    def _choose(self, step: int, batch: Batch | None, occupancy) -> None:
        """The window's choice of the batch just scheduled: the session started for it, or
        ended when nothing needs it."""
        chosen = batch is not None and self._chosen.choose(
            step, lambda: StepView.of(step, batch, occupancy()), self.hooks.defer
        )
        if chosen and not self.profiling:  # NOTE: a start inside the step: its host time
            self._start()
            self._start_ms[step] = self._session.start_ms
        elif not chosen and self.profiling and not self._chosen.awaiting:
            self.flush()

    def flush(self) -> None:
        """End the profiler session, if one runs. Its events are read and given to the steps
        it covered (their records and the history's events table) when the history is read
        (`History.fill_in`), not here: reading a long run's hundreds of thousands of kernels
        takes seconds of Python."""
        if not self.profiling:
            return
        self.profiling = self.ranks.session_running = False
        marks, self._marks = self._marks, []
        lists, self._pending = self._pending, {}
        # a batch launched in this session and still in flight (overlap, stepping by hand):
        # its record, built in a later step, takes the list its launch's events will fill
        self._early = {}
        for _, step, kind in marks:
            if kind == "launch" and step in self._chosen.awaiting and step not in lists:
                lists[step] = self._early[step] = StepEvents()
        read = self._session.stop()
        self.history.sessions.append(SessionEvents(read, marks, lists, self._start_ms, self.device))

    # -- hook points, in the order they fire ----------------------------------------------
    def request_arrive(
        self,
        step: int,
        uid: int,
        prompt_len: int,
        max_tokens: int,
        seconds: float,
        source: str = "python",
    ) -> None:
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
        mark, marked = (started, -1 if batch is None else step, "launch"), self.profiling
        if marked:
            self._marks.append(mark)
        if self.record == "full" and self.profiles:
            self._choose(step, batch, occupancy)
        if self.profiling and not marked:
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
        self, step: int, batch: Batch, new_pages: int, table: TableManager, launch: Launch
    ) -> dict[int, tuple] | None:
        """Fires "batch.prepared" and "forward.begin"; with record="full", returns what the
        batch's page-table rows gained as slot runs (`PageSnapshots`), taken now: with overlap
        they change before the batch is collected."""
        page_rows = None
        if self.record == "full":
            page_rows = self._pages.take(table, batch.launched_views(), step)
        hooks = self.hooks
        if "batch.prepared" in hooks:
            rows = batch.launched_views()
            num_tokens = sum(r.extend_len for r in rows)
            event = ev.BatchPrepared(step, batch.phase, tuple(rows), num_tokens, new_pages)
            hooks.emit("batch.prepared", event)
        if "forward.begin" in hooks:
            n, bs = sum(r.extend_len for r in batch.launched_views()), batch.size
            event = ev.ForwardBegin(step, batch.phase, bs, n, launch.cuda_graph)
            hooks.emit("forward.begin", event)
        return page_rows

    def forward_end(self, step: int, batch: Batch) -> None:
        if "forward.end" in self.hooks:
            self.hooks.emit("forward.end", ev.ForwardEnd(step, batch.phase, tuple(batch.views())))

    def sample_end(self, step: int, batch: Batch, tokens: list[int], started: float) -> None:
        """`started`: when the collect began (where the profiler's events of it begin)."""
        if self.profiling:
            self._marks.append((started, step, "collect"))
        if "sample.end" in self.hooks:
            uids = tuple(r.uid for r in batch.sampled_reqs)
            self.hooks.emit("sample.end", ev.SampleEnd(step, uids, tuple(tokens)))

    def request_finish(
        self, step: int, req: Req, between_steps: bool = False, seconds: float = 0.0
    ) -> None:
        """A request ended. `between_steps`: not by a token of a step's record (an abort, or
        its step failed, at `seconds`), so the history is told here."""
        if between_steps:
            self.history.abort(req.uid, step, seconds, req.finish_reason)
        if "request.finish" in self.hooks:
            event = ev.RequestFinish(
                step, req.uid, req.finish_reason, req.prompt_len, req.cached_tokens, req.output_len
            )
            self.hooks.emit("request.finish", event)

    def step_end(self, record: StepRecord) -> None:
        """The step's record, kept in the history (record="light" or "full") and handed to
        "step.end"."""
        step = record.step
        profiled = self._chosen.recorded(step) and self.profiling
        if profiled:
            # its launch's events, when an earlier session saw it (overlap, stepping by hand);
            # filled when the events are read
            early = self._early.pop(step, None) if self._early else None
            record.events = early if early is not None else StepEvents()
            self._pending[step] = record.events
        if record.tp_size > 1 and self.ranks.present:
            launch = record.launch.index
            record.rank_device_ms = self.ranks.times_of(launch)  # filled when read
            if profiled:  # the other ranks' events, and their clocks' offsets
                record.rank_events, record.rank_clock_ms = self.ranks.events_of(
                    launch, record.events
                )
        if self.record != "off":
            self.history.append(record.complete())
        if "step.end" in self.hooks:
            self.hooks.emit("step.end", record.complete())
