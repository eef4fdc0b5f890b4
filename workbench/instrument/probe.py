"""The probe: the scheduler's observer, which keeps hook events, the history and the profiler."""

from __future__ import annotations

import time
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
    from ..history.roofline import Roofline
    from ..kvcache.table import TableManager
    from ..scheduler.record import Occupancy


class Probe(Observer):
    """Keeps what the scheduler reports (the hook points are documented on `Observer`)."""

    profiles = True  # False for a twin's probe: no kernels to profile

    def __init__(
        self,
        record: str = "off",
        hooks: HookRegistry | None = None,
        device: torch.device | str = "cpu",
        profile_steps: Any = None,
        roofline: Roofline | None = None,
        max_profiled_steps: int | None = None,
    ) -> None:
        """`profile_steps`, `max_profiled_steps`: which steps record="full" profiles
        (`window.py`); `roofline`: for the history's steps table (None: NaN columns)."""
        self.record = V.choice("record", record, RECORD_LEVELS)
        self.window = profile_window(profile_steps, max_profiled_steps)
        self.hooks = hooks if hooks is not None else HookRegistry()
        self.device = torch.device(device)
        self.roofline = roofline
        self.clock = RunClock()  # replaced by the scheduler's
        self.ranks = OtherRanks()
        self.meta: dict = {}  # `LLM.run_meta`
        self.profiling = False
        self._session: ProfilerSession | None = None
        self.restart()
        self.hooks.on_change = self.listen
        self.listen()

    def listen(self) -> None:
        """Recompute what the scheduler tells this probe from the record level and the hooks."""
        self.inside = self.record == "full" or self.hooks.inside
        self.at_end = self.record != "off" or self.hooks.at_end

    def like(self, record: str, profile_steps) -> Probe:
        """A probe with another record level and profile window, the same hooks and device."""
        probe = Probe(record, self.hooks, self.device, profile_steps, roofline=self.roofline)
        probe.ranks, probe.meta = self.ranks.like(), self.meta
        probe.restart()
        return probe

    def restart(self) -> None:
        """A new run: an empty history; the hooks stay."""
        if self._session is not None:
            self._session.discard()
            self.profiling = self.ranks.session_running = False
        if getattr(self, "history", None) is not None:
            self.history.fill_in()
        self._marks: list[tuple[float, int, str]] = []  # seconds, step, "launch" | "collect"
        self._early: dict[int, list] = {}  # events of a batch launched before a session ended
        self._pending: dict[int, list] = {}
        self._start_ms: dict[int, float] = {}
        self._stop_ms: dict[int, float] = {}  # a step that ended a session: what stopping took
        self._chosen = ChosenSteps(self.window)
        self._pages = PageSnapshots()
        self.ranks.restart()
        self.history = History(self.roofline, self.ranks if self.ranks.present else None)
        self.history.meta.update(self.meta)

    def before_step(self, index: int) -> None:
        """With record="full", start or end the profiler session as the window wants."""
        if self.record != "full" or not self.profiles:
            return
        wanted = self._chosen.wanted_at(index)
        if wanted:
            self._start()
        elif wanted is False and self.profiling:
            self.flush(index)

    def _start(self) -> None:
        if self._session is None:
            self._session = ProfilerSession(self.clock.now, self.device)
        if not self._session.running:
            self._session.start()
        self.profiling = self.ranks.session_running = True

    def _choose(self, step: int, batch: Batch | None, occupancy) -> None:
        chosen = batch is not None and self._chosen.choose(
            step, lambda: StepView.of(step, batch, occupancy()), self.hooks.defer
        )
        if chosen and not self.profiling:
            self._start()
            self._start_ms[step] = self._session.start_ms
        elif not chosen and self.profiling and not self._chosen.awaiting:
            self.flush(step)

    def flush(self, step: int | None = None) -> None:
        """End the profiler session, if one runs; its events are read when the history is.
        `step`: the step it ends in (before its launch), whose record says what stopping took."""
        if not self.profiling:
            return
        self.profiling = self.ranks.session_running = False
        marks, self._marks = self._marks, []
        lists, self._pending = self._pending, {}
        # NOTE: a batch launched in this session and still in flight gets its list now
        self._early = {}
        for _, marked, kind in marks:
            if kind == "launch" and marked in self._chosen.awaiting and marked not in lists:
                lists[marked] = self._early[marked] = StepEvents()
        began = time.perf_counter()
        read = self._session.stop()
        if step is not None:
            self._stop_ms[step] = (time.perf_counter() - began) * 1e3
        self.history.sessions.append(SessionEvents(read, marks, lists, self._start_ms, self.device))

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
        # NOTE: mark before the choice (a session it ends covers the launch), or after it starts one
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
            for a in admissions.decided:
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
        # NOTE: page rows are taken now: with overlap they change before the batch is collected
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

    def sample_end(
        self,
        step: int,
        batch: Batch,
        tokens: list[int],
        started: float,
        logprobs=None,
        prompt_logprobs=None,
    ) -> None:
        if self.profiling:
            self._marks.append((started, step, "collect"))
        if "sample.end" in self.hooks:
            uids = tuple(r.uid for r in batch.sampled_reqs)
            lps = None if logprobs is None else tuple(logprobs)
            plps = None if prompt_logprobs is None else tuple(prompt_logprobs)
            self.hooks.emit("sample.end", ev.SampleEnd(step, uids, tuple(tokens), lps, plps))

    def moe_route(self, step: int, launch: Launch) -> None:
        if "moe.route" in self.hooks:
            counts = tuple(map(tuple, launch.host_routing().tolist()))
            self.hooks.emit("moe.route", ev.MoeRoute(step, launch.moe_layers, counts))

    def request_finish(
        self, step: int, req: Req, between_steps: bool = False, seconds: float = 0.0
    ) -> None:
        if between_steps:
            self.history.abort(req.uid, step, seconds, req.finish_reason)
        if "request.finish" in self.hooks:
            event = ev.RequestFinish(
                step, req.uid, req.finish_reason, req.prompt_len, req.cached_tokens, req.output_len
            )
            self.hooks.emit("request.finish", event)

    def step_end(self, record: StepRecord) -> None:
        step = record.step
        if self._stop_ms:
            record.profiler_stop_ms = self._stop_ms.pop(step, 0.0)
        profiled = self._chosen.recorded(step) and self.profiling
        if profiled:
            early = self._early.pop(step, None) if self._early else None
            record.events = early if early is not None else StepEvents()
            self._pending[step] = record.events
        if record.tp_size > 1 and self.ranks.present:
            launch = record.launch.index
            record.rank_device_ms = self.ranks.times_of(launch)
            if profiled:
                record.rank_events, record.rank_clock_ms = self.ranks.events_of(
                    launch, record.events
                )
        if self.record != "off":
            self.history.append(record.complete())
        if "step.end" in self.hooks:
            self.hooks.emit("step.end", record.complete())
