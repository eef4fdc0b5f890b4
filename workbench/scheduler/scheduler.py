"""The scheduler loop: choose a batch, prepare it, launch it, sample, and process the results.

A step is split in two halves. `launch` schedules a batch, allocates its KV pages, has the
engine prepare it (every device-side write of the step) and enqueue its forward and sampling,
and moves each request's device-side ledger (`Req.complete_all`). `collect` waits for the
sampled tokens and processes them on the host: append, finish on EOS or `max_tokens`, free.
Without overlap a step is `collect(launch())`. With overlap the next batch is launched before the
previous one is collected, so the CPU prepares step N+1 while the GPU runs step N. Two
consequences, both handled here:

- a request that hits EOS in batch N is usually in batch N+1 already: that batch's token for it is
  dropped, and its slot and KV pages are freed only when batch N+1 is collected;
- a request that reaches `max_tokens` is known at launch (its `remain_len` is 0), so it is never
  scheduled past its last token.

Each step has one `StepRecord`, made at launch and completed at collect. The observer (the
instrumentation's `Probe`) is told of the step at its start and end; it hears of the inside
(hook points, profiler marks) only while it asks to (`Observer.inside`), so a step nobody
watches runs none of its code.
"""

from __future__ import annotations

import numpy as np

from ..clocks import RunClock, StageClock
from ..config import EngineConfig
from ..core import Admissions, Batch, PendingReq, Req, SamplingParams
from ..engine.engine import Engine
from ..kvcache import create_prefix_cache
from ..kvcache.base import CacheHandle
from ..policies import SchedulerState, policy
from .cache import CacheManager
from .decode import DecodeManager
from .integrity import check_integrity
from .observer import Observer
from .prefill import PrefillAdder, PrefillManager
from .record import Occupancy, StepRecord


class StepError(RuntimeError):
    """A scheduler step failed; the requests of its batch ended with finish_reason "error" and
    gave back what they held. The engine keeps serving the others. `stage`: where it failed,
    one of `clocks.STAGES` ("prepare", "plan", "forward", "sample", "wait", "collect", ...)."""

    def __init__(self, stage: str, uids: list[int], message: str) -> None:
        self.stage, self.uids = stage, uids
        super().__init__(
            f"a step failed in {stage} ({message}); requests {uids} ended with "
            'finish_reason="error" and their KV pages and slots were freed'
        )


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        probe: Observer | None = None,
        config: EngineConfig | None = None,
        clock: RunClock | None = None,
    ):
        """`probe` is told of every step (`Observer`; `LLM` gives the instrumentation's `Probe`,
        which keeps hooks, records and the profiler; None: nobody watches); `config`: the
        scheduler's settings when they differ from those the engine was built with
        (`LLM.reconfigure`); `clock`: the run's time axis (a twin's runs on predicted time)."""
        config = config if config is not None else engine.config
        self.engine, self.config, self.probe = engine, config, probe
        self.clock = clock if clock is not None else RunClock()
        if probe is not None:
            probe.clock = self.clock
        self.table = engine.table
        self.overlap = config.overlap_enabled
        self.cache = CacheManager(
            engine.num_pages, config.page_size, create_prefix_cache(config.cache, config.page_size)
        )
        self.prefill = PrefillManager()
        self.decode = DecodeManager(config.page_size)
        self.eos_ids = frozenset(engine.model_config.eos_token_ids)
        self._eos_array = np.array(sorted(self.eos_ids), dtype=np.int64)
        self.finished: dict[int, Req] = {}  # uid -> request, until the caller collects it
        self.in_flight: StepRecord | None = None  # overlap: launched, not collected yet
        self.previous: Batch | None = None  # the batch launched last (`Batch.snapshot`)
        self.watch: Observer | None = None  # the probe, while it hears of a step's inside
        self.step_index = 0
        self._next_uid = 0

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
        if self.probe is not None:
            arrived = self.clock.now() if arrived is None else arrived
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
    def step(self) -> StepRecord | None:
        """Run one batch to completion and return its record; None when there is nothing to
        do. With overlap, the batch after it is already launched when this returns."""
        probe = self.probe
        self.watch = probe if probe is not None and probe.inside else None
        self.cache.on_evict = None if self.watch is None else self._evicted
        if self.watch is not None:
            self.watch.before_step(self.step_index)
        if not self.overlap:
            launched = self.launch()
            return None if launched is None else self._end(self.collect(launched))
        if self.in_flight is None:
            self.in_flight = self.launch()
            if self.in_flight is None:
                return None
        current = self.in_flight
        self.in_flight = self.launch()
        current.overlapped = self.in_flight is not None
        return self._end(self.collect(current))

    def flush(self) -> StepRecord | None:
        """Collect the batch in flight (overlap) without launching another."""
        if self.in_flight is None:
            return None
        current, self.in_flight = self.in_flight, None
        return self._end(self.collect(current))

    def _end(self, record: StepRecord) -> StepRecord:
        """The step's end, where the probe keeps its record (its time is the record stage's)."""
        probe = self.probe
        if probe is not None and probe.at_end:
            record.stages.enter("record")
            probe.step_end(record)
        return record

    def launch(self) -> StepRecord | None:
        """Schedule a batch, allocate its pages, and have the engine prepare it and enqueue its
        forward and sampling; each stage of the host's work is timed by the step's
        `StageClock`."""
        watch, index = self.watch, self.step_index
        stages = StageClock(ranges=watch is not None and watch.profiling)
        started = self.clock.now()
        batch, admissions = self.schedule_next_batch()
        if watch is not None:
            watch.schedule_end(index, batch, admissions, started, self.occupancy)
            stages.ranges = watch.profiling  # (a profile window may have started a session)
        if batch is None:
            self._check_not_stuck(admissions)
            return None
        previous, self.previous = self.previous, None  # this batch, once it has launched
        try:
            stages.enter("prepare")
            new_pages = self.cache.allocate(batch, self.table, previous)
            stages.enter("plan")
            launch = self.engine.prepare(batch)
            page_rows = None
            if watch is not None:
                page_rows = watch.batch_prepared(index, batch, new_pages, self.table, launch)
            stages.enter("forward")
            logits = self.engine.forward(launch)
            Req.complete_all(batch.reqs)
            stages.enter("sample")
            self.engine.sample(launch, logits)
            if watch is not None:
                watch.forward_end(index, batch)
            stages.enter("share")
            if batch.is_prefill and self.cache.shares:
                self._share_prompts(batch)
        except BaseException as exc:
            error = self._fail_batch(batch, exc, stages.stage)
            if error is exc:
                raise
            raise error from exc
        self.previous = batch
        self.decode.filter_reqs(batch)
        self.step_index += 1
        stages.enter(None)
        record = StepRecord.launched(index, batch, admissions, launch, started, stages, previous)
        record.page_rows = page_rows
        return record

    def _share_prompts(self, batch: Batch) -> None:
        """Offer the prompt pages the batch computes to the prefix cache."""
        # NOTE: safe before the forward has run: any batch that reads these pages is launched
        # later on the same stream. Doing it now (not at collect) also hands the new handle to
        # a chunk's continuation, which is scheduled before this batch is collected.
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
        watch = self.watch
        adder = PrefillAdder(
            token_budget=token_budget,
            reserved_size=self.decode.reserved_size,
            cache=self.cache,
            table=self.table,
            slots_left=self.free_slots,
            share_threshold=self.config.share_threshold if self.cache.shares else 0,
            on_match=None if watch is None else watch.cache_match_hook(self.step_index),
        )
        return self.prefill.schedule(adder)

    def _check_not_stuck(self, admissions: Admissions) -> None:
        if self.prefill.queue and not self.decode.running and self.in_flight is None:
            raise RuntimeError(
                f"request {self.prefill.queue[0].uid} can never be admitted "
                f"({admissions.decided[0].reason}); it should have been rejected when it was added"
            )

    def collect(self, record: StepRecord) -> StepRecord:
        """Wait for a launched batch's tokens; append them, finish, free what nothing uses."""
        watch, probe, batch, stages = self.watch, self.probe, record.batch, record.stages
        stages.ranges = watch is not None and watch.profiling
        index, launch = record.step, record.launch
        start = self.clock.now()
        try:
            stages.enter("wait")
            self.engine.wait(launch)
            if probe is not None and probe.at_end:
                # NOTE: a step that sampled nothing (a prompt's chunk) has no tokens to wait
                # for; its record's device time would wait for it instead, and that wait be
                # counted as recording
                record.device_ms = launch.timer.elapsed_ms()
            waited = self.clock.now() - start
            stages.enter("collect")
            raw = launch.tokens.tolist()
            if watch is not None:
                watch.sample_end(index, batch, raw, start)
            tokens, ends = self._append_tokens(batch, raw)
            finishes = []
            for req, reason in ends:  # all ended before any hook runs (Ctrl-C in one)
                req.finish_reason = reason
                self._ended(req)
                finishes.append((req.uid, reason))
            if watch is not None:
                for req, _ in ends:
                    watch.request_finish(index, req)
            self._free_finished(batch)
        except BaseException as exc:
            error = self._fail_batch(batch, exc, stages.stage)
            if error is exc:
                raise
            raise error from exc
        stages.enter(None)
        record.collected(tokens, finishes, self.clock.now(), waited * 1e3, self.occupancy())
        return record

    def _append_tokens(
        self, batch: Batch, raw: list[int]
    ) -> tuple[list[int | None], list[tuple[Req, str]]]:
        """Each sampled request's token appended on the host; those that end with it are
        returned with their finish reason, which the caller sets as it ends them (so a failure
        in between leaves no request with a reason that has not ended). A request that
        finished in the batch before (overlap) is past its end here: its token is dropped
        (None). Only the requests that may end here are looked at one by one: those whose
        token is an EOS token, or is their last (known from the ledger)."""
        reqs, eos_ids = batch.sampled_reqs, self.eos_ids
        tokens: list[int | None] = raw
        past_end = [i for i, r in enumerate(reqs) if r.finish_reason is not None]
        if past_end:
            tokens = list(raw)
            for i in past_end:
                tokens[i] = None
        for req, token in zip(reqs, tokens):
            if token is not None:
                req.token_ids.append(token)
        last = batch.ledger[2] + 1 >= batch.max_lens
        if batch.phase != "decode":
            last = last[batch.sampled_mask()]
        may_end = np.flatnonzero(last | np.isin(raw, self._eos_array))
        ends = []
        for i in may_end.tolist():
            req, token = reqs[i], tokens[i]
            reason = None if token is None else req.end_reason(token, eos_ids)
            if reason is not None:
                ends.append((req, reason))
        return tokens, ends

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
            cache.prefix_cache.evictable_size,
            cache.total_size,
        )

    # -- KV pages and the prefix cache ------------------------------------------------------
    def _evicted(self, requested: int, freed: int) -> None:
        self.watch.cache_evict(self.step_index, requested, freed)

    def cache_prefix(self, req: Req) -> None:
        """Share the full pages of a prompt computed so far, while its request keeps running."""
        inserted, kept = self.cache.share_prompt(req, self.table)
        if inserted and self.watch is not None:
            self.watch.cache_insert(self.step_index, req.uid, inserted, kept)

    def free_req(self, req: Req) -> None:
        """Give back a request's slot and pages (its full pages to the prefix cache)."""
        inserted, kept = self.cache.free_req(req, self.table)
        if inserted and self.watch is not None:
            self.watch.cache_insert(self.step_index, req.uid, inserted, kept)

    # -- requests that end early: an abort, or a step that failed ---------------------------
    def _ended(self, req: Req) -> None:
        """A request has its finish reason: out of the running set, into `finished`."""
        self.decode.running.pop(req, None)
        self.finished[req.uid] = req

    def _fail_batch(self, batch: Batch, exc: BaseException, stage: str) -> BaseException:
        """A step is all or nothing: every request of the batch that had not ended ends with
        finish_reason "error", and what it holds is freed now, or once the batch in flight
        that still computes for it is collected. Returns the exception for the caller: a
        StepError naming the requests and the stage that failed, or a KeyboardInterrupt (and
        the like) as it was."""
        message = f"{type(exc).__name__}: {exc}"
        in_flight = {r.uid: r for r in self.in_flight.batch.reqs} if self.in_flight else {}
        failed = []
        for req in batch.reqs:
            if req.finish_reason is None:
                req.finish_reason, req.error = "error", message
                self._ended(req)
                failed.append(req)
            other = in_flight.get(req.uid)
            if req.released or other is req:
                continue  # a batch in flight still computes for it: freed when collected
            if other is None:
                self.free_req(req)
                continue
            # NOTE: a prompt's chunks are separate objects over one row, and the later one
            # holds every page of the earlier. Freeing now is safe: the chunk in flight writes
            # its pages before any batch launched later runs (one stream).
            other.finish_reason, other.error = req.finish_reason, req.error
            self.decode.running.pop(other, None)  # a prompt's last chunk joined it at launch
            keep, drop = (req, other) if req.alloc_len >= other.alloc_len else (other, req)
            self.free_req(keep)
            drop.released = True
        dropped = {r.uid for r in failed}
        self.prefill.queue = [p for p in self.prefill.queue if p.uid not in dropped]
        if self.probe is not None:
            now = self.clock.now()
            for req in failed:
                self.probe.request_finish(self.step_index, req, between_steps=True, seconds=now)
        if not isinstance(exc, Exception):  # KeyboardInterrupt and the like: as they were
            return exc
        return StepError(stage, [r.uid for r in failed], message)

    def abort(self, uid: int) -> Req:
        """Stop a request wherever it is: waiting, part-way through its prompt, or decoding.

        It ends with finish_reason "abort" and the tokens it has. Its slot and KV pages are freed
        now, or, when a launched batch still computes for it (overlap), when that batch is
        collected: nothing a batch in flight writes to is handed out again before it is done.
        """
        if uid in self.finished:
            raise ValueError(
                f"request {uid} has already finished ({self.finished[uid].finish_reason})"
            )
        in_flight = self.in_flight.batch.reqs if self.in_flight is not None else []
        pending = next((p for p in self.prefill.queue if p.uid == uid), None)
        if pending is not None:
            self.prefill.queue.remove(pending)
            req = pending.chunked
            if req is None:  # never admitted: it holds nothing
                ids = list(pending.token_ids)
                req = Req(uid, ids, len(ids), -1, 0, pending.sampling, CacheHandle())
        else:
            # running, or its last token in flight (then it is no longer in the running set)
            live = (r for r in [*self.decode.running, *in_flight] if r.finish_reason is None)
            req = next((r for r in live if r.uid == uid), None)
            if req is None:
                raise ValueError(f"no request {uid} is waiting or running")
        req.finish_reason = "abort"
        self._ended(req)
        if req.table_idx >= 0 and req not in in_flight:
            self.free_req(req)
        if self.probe is not None:
            now = self.clock.now()
            self.probe.request_finish(self.step_index, req, between_steps=True, seconds=now)
        return req

    # -- lifecycle and checks ---------------------------------------------------------------
    def abort_all(self) -> None:
        """Drop every request, free what they hold, and empty the prefix cache."""
        self.flush()
        for req in self.live_reqs:
            self.free_req(req)
        self.prefill.queue.clear()
        self.decode.running.clear()
        self.finished.clear()
        self.previous = None
        self.cache.evict(self.cache.total_size)
        self.step_index = 0
        self.clock.restart()
        if self.probe is not None:
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
