"""The scheduler loop: choose a batch, prepare it, launch it, sample, and process the results.

A step is split in two halves. `launch` schedules a batch, prepares it, runs the forward and the
sampler (on a GPU these are only enqueued), and moves each request's device-side ledger
(`complete_one`). `collect` waits for the sampled tokens and processes them on the host: append,
finish on EOS or `max_tokens`, free. Without overlap a step is `collect(launch())`. With overlap the
next batch is launched before the previous one is collected, so the CPU prepares step N+1 while
the GPU runs step N. Two consequences, both handled here:

- a request that hits EOS in batch N is usually in batch N+1 already: that batch's token for it is
  dropped, and its slot and KV pages are freed only when batch N+1 is collected;
- a request that reaches `max_tokens` is known at launch (its `remain_len` is 0), so it is never
  scheduled past its last token.

Hook points fire on this side only (never inside the forward), so they work the same with CUDA
graphs; each profiler range is named after the hook point that fires at its end.
"""

from __future__ import annotations

from ..config import EngineConfig
from ..core import Admissions, Batch, PendingReq, Req, SamplingParams
from ..engine.engine import Engine
from ..kvcache import create_prefix_cache
from ..policies import SchedulerState, policy
from ..stages import StageClock
from .cache import CacheManager
from .collect import append_tokens
from .decode import DecodeManager
from .ending import EarlyEnds
from .integrity import check_integrity
from .observer import Observer
from .outcome import InFlight, Occupancy, StepOutcome
from .prefill import PrefillAdder, PrefillManager
from .prepare import prepare_batch


class Scheduler(EarlyEnds):
    def __init__(
        self, engine: Engine, probe: Observer | None = None, config: EngineConfig | None = None
    ):
        """`probe` is told of every step (`Observer`; `LLM` gives the instrumentation's `Probe`,
        which keeps hooks, records and the profiler; None: nobody watches); `config`: the
        scheduler's settings when they differ from those the engine was built with
        (`LLM.reconfigure`)."""
        probe = probe if probe is not None else Observer()
        config = config if config is not None else engine.config
        self.engine, self.config, self.probe = engine, config, probe
        self.table = engine.table
        self.overlap = config.overlap_enabled
        self.cache = CacheManager(
            engine.num_pages, config.page_size, create_prefix_cache(config.cache, config.page_size)
        )
        self.cache.on_evict = lambda asked, freed: probe.cache_evict(self.step_index, asked, freed)
        self.prefill = PrefillManager()
        self.decode = DecodeManager(config.page_size)
        self.eos_ids = frozenset(engine.model_config.eos_token_ids)
        self.finished: dict[int, Req] = {}  # uid -> request, until the caller collects it
        self.in_flight: InFlight | None = None  # overlap: the batch launched but not collected
        self._launched: Batch | None = None  # the batch launched last (`Batch.snapshot`)
        self.step_index = 0
        self._next_uid = 0

    def clock(self) -> float:
        return self.probe.clock()

    # -- requests ---------------------------------------------------------------------------
    def new_uid(self) -> int:
        uid, self._next_uid = self._next_uid, self._next_uid + 1
        return uid

    def add_request(
        self,
        token_ids: list[int],
        sampling: SamplingParams,
        uid: int | None = None,
        arrived: float | None = None,
        source: str = "python",
    ) -> int:
        """Queue a validated request; resources are taken only when it is admitted. `arrived`:
        when it reached the engine's door on the run's clock (the server's receipt of an HTTP
        request; None: now); `source`: how it came ("python", "http")."""
        uid = self.new_uid() if uid is None else uid
        self.prefill.add(PendingReq(uid, list(token_ids), sampling))
        self.probe.request_arrive(
            self.step_index, uid, len(token_ids), sampling.max_tokens, arrived, source
        )
        return uid

    @property
    def is_idle(self) -> bool:
        return not self.prefill.queue and not self.decode.running and self.in_flight is None

    @property
    def live_reqs(self) -> list[Req]:
        """Requests holding resources: running, or mid-way through a chunked prefill."""
        chunked = [p.chunked for p in self.prefill.queue if p.chunked is not None]
        return [*chunked, *self.decode.running]

    # -- one step ---------------------------------------------------------------------------
    def step(self) -> StepOutcome | None:
        """Run one batch to completion and return what it did; None when there is nothing to do.

        With overlap, the batch after it is already launched when this returns. With
        record="full" the step runs under the probe's profiler session; its record gets the
        events when the session ends (`probe.flush()`).
        """
        self.probe.before_step(self.step_index)
        outcome = self._step()
        return None if outcome is None else self._finish(outcome)

    def _step(self) -> StepOutcome | None:
        if not self.overlap:
            launched = self.launch()
            return None if launched is None else self.collect(launched)
        if self.in_flight is None:
            self.in_flight = self.launch()
            if self.in_flight is None:
                return None
        current = self.in_flight
        self.in_flight = self.launch()
        current.overlapped = self.in_flight is not None
        return self.collect(current)

    def flush(self) -> StepOutcome | None:
        """Collect the batch in flight (overlap) without launching another."""
        if self.in_flight is None:
            return None
        current, self.in_flight = self.in_flight, None
        return self._finish(self.collect(current))

    def _finish(self, outcome: StepOutcome) -> StepOutcome:
        outcome.record = self.probe.step_end(outcome, self.occupancy)
        return outcome

    @property
    def free_slots(self) -> int:
        """Request slots free under `max_running_reqs` (which `reconfigure` may lower below the
        table's rows)."""
        table = self.table
        in_use = table.max_running_reqs - table.available_size
        return min(table.available_size, self.config.max_running_reqs - in_use)

    def occupancy(self) -> Occupancy:
        cache = self.cache
        return Occupancy(
            len(self.prefill.queue),
            len(self.decode.running),
            self.free_slots,
            cache.free_size,
            cache.evictable_size,
            cache.total_size,
        )

    def launch(self) -> InFlight | None:
        """Schedule a batch, prepare it, and enqueue its forward and sampling: each stage of
        the step's host work is timed by its clock and runs in the profiler range of the hook
        point reported after it (`StageClock.during`)."""
        probe, step, started = self.probe, self.step_index, self.clock()
        clock = StageClock()
        with clock.during("schedule", probe.range("schedule.end")):
            batch, admissions = self.schedule_next_batch()
        probe.schedule_end(step, batch, admissions, started, self.occupancy)
        if batch is None:
            self._check_not_stuck(admissions)
            return None
        graph = self.engine.uses_graph(batch)  # a padded graph step (captured or eager)
        after, self._launched = self._launched, None  # this batch, once it has launched
        with self._all_or_nothing(batch, clock):
            with clock.during("prepare", probe.range("batch.prepared")):
                new_pages = self._prepare(batch, clock, graph, after)  # "prepare", then "plan"
            page_rows = probe.batch_prepared(step, batch, new_pages, self.table)
            captured = graph and self.engine.captures_graphs
            probe.forward_begin(step, batch, captured)
            with clock.during("forward", probe.range("forward.end")):
                device = self.engine.run_batch(batch, clock)  # "forward", then "sample"
            probe.forward_end(step, batch)
            clock.enter("share")
            self._share_prompts(batch)
        self._launched = batch
        self.decode.filter_reqs(batch)
        self.step_index += 1
        clock.enter(None)
        padded, launch_ms = self.engine.padded_size(batch), (self.clock() - started) * 1e3
        return InFlight(
            step, batch, admissions, device, started, padded, captured, page_rows, launch_ms,
            clock=clock, padded_tokens=self.engine.padded_tokens(batch),
        )  # fmt: skip

    def _prepare(self, batch: Batch, clock: StageClock, graph: bool, after: Batch | None) -> int:
        """The batch's KV pages and inputs, then its attention metadata; the pages allocated.
        A CUDA-graph step writes its new page-table entries on the device itself. `after`: the
        batch launched just before (`Batch.snapshot`)."""
        new_pages = prepare_batch(batch, self.cache, self.table, not graph, after)
        self.engine.fill_inputs(batch)
        clock.enter("plan")
        self.engine.plan(batch)
        return new_pages

    def _share_prompts(self, batch: Batch) -> None:
        # NOTE: safe before the forward has run: any batch that reads these pages is launched
        # later on the same stream. Doing it now (not at collect) also hands the new handle to
        # a chunk's continuation, which is scheduled before this batch is collected.
        if batch.is_prefill and self.cache.shares:
            for req in batch.prefill_reqs:
                self.cache_prefix(req)

    def schedule_next_batch(self) -> tuple[Batch | None, Admissions]:
        """The configured policy's batch and the admission decisions behind it."""
        config = self.config
        state = SchedulerState(
            self.prefill.queue, list(self.decode.running), config.max_extend_tokens, self._admit
        )
        return policy(config.policy)(state)

    def _admit(self, token_budget: int) -> tuple[list[Req], Admissions]:
        """Admission over the queue with this token budget (`PrefillAdder`'s five checks)."""
        return self.prefill.schedule(self._new_adder(token_budget))

    def _new_adder(self, token_budget: int) -> PrefillAdder:
        return PrefillAdder(
            token_budget=token_budget,
            reserved_size=self.decode.reserved_size,
            cache=self.cache,
            table=self.table,
            slots_left=self.free_slots,
            share_threshold=self.config.share_threshold if self.cache.shares else 0,
            on_match=self.probe.cache_match_hook(self.step_index),
        )

    def _check_not_stuck(self, admissions: Admissions) -> None:
        if self.prefill.queue and not self.decode.running and self.in_flight is None:
            raise RuntimeError(
                f"request {self.prefill.queue[0].uid} can never be admitted "
                f"({admissions.decided[0].reason}); it should have been rejected when it was added"
            )

    def collect(self, launched: InFlight) -> StepOutcome:
        """Wait for a launched batch's tokens; append them, finish, free what nothing uses."""
        probe, batch, step, clock = self.probe, launched.batch, launched.index, launched.clock
        start = self.clock()
        with self._all_or_nothing(batch, clock):
            with clock.during("wait", probe.range("sample.end")):
                self.engine.wait(launched.device)
                if probe.times_device():
                    # NOTE: a step that sampled nothing (a prompt's chunk) has no tokens to
                    # wait for; its record's device time would wait for it instead, and that
                    # wait be counted as recording (0.9 ms a chunk of 64 on the H200)
                    launched.device.timer.elapsed_ms()
                waited = self.clock() - start
                clock.enter("collect")
                raw = launched.device.tokens.tolist()
            probe.sample_end(step, batch, raw, start)
            clock.enter("collect")
            tokens, ends = append_tokens(batch, raw, self.eos_ids)
            finished = [req for req, _ in ends]
            for req, reason in ends:  # all ended before any hook runs (Ctrl-C in one)
                req.finish_reason = reason
                self._end(req)
            for req in finished:
                probe.request_finish(step, req)
            self._free_finished(batch)
        clock.enter(None)
        end = self.clock()
        wait_ms, collect_ms = waited * 1e3, (end - start - waited) * 1e3
        return StepOutcome(launched, tokens, finished, end, wait_ms, collect_ms)

    def _free_finished(self, batch: Batch) -> None:
        # NOTE: a finished request in the batch launched after this one still uses its slot and
        # pages; that batch's collect frees them. All rows, not only the sampled ones: an
        # aborted chunk is freed here too.
        ended = [r for r in batch.reqs if r.finish_reason is not None and not r.released]
        if not ended:
            return
        still_used = set(self.in_flight.batch.reqs) if self.in_flight is not None else set()
        for req in ended:
            if req not in still_used:
                self.free_req(req)

    # -- KV pages and the prefix cache ------------------------------------------------------
    def cache_prefix(self, req: Req) -> None:
        """Share the full pages of a prompt computed so far, while its request keeps running."""
        inserted, kept = self.cache.share_prompt(req, self.table)
        if inserted:
            self.probe.cache_insert(self.step_index, req.uid, inserted, kept)

    def free_req(self, req: Req) -> None:
        """Give back a request's slot and pages (its full pages to the prefix cache)."""
        inserted, kept = self.cache.free_req(req, self.table)
        if inserted:
            self.probe.cache_insert(self.step_index, req.uid, inserted, kept)

    # -- lifecycle and checks ---------------------------------------------------------------
    def abort_all(self) -> None:
        """Drop every request, free what they hold, and empty the prefix cache."""
        self.flush()
        for req in self.live_reqs:
            self.free_req(req)
        self.prefill.queue.clear()
        self.decode.running.clear()
        self.finished.clear()
        self._launched = None
        self.cache.evict(self.cache.total_size)
        self.step_index = 0
        self.probe.restart()

    def check_integrity(self) -> None:
        """KV pool accounting: every page free, cached, or used by exactly one request that
        holds it (running, part-way through its prompt, or in the batch in flight); any time
        between steps, with overlap too."""
        holders = {id(r): r for r in self.live_reqs}
        if self.in_flight is not None:  # ended requests wait there for the batch to complete
            holders |= {id(r): r for r in self.in_flight.batch.reqs if not r.released}
        check_integrity(self.cache, self.table, list(holders.values()))
        self.engine.check_ranks()
