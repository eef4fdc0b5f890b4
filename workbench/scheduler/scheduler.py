"""The scheduler loop: `launch` schedules and enqueues a batch, `collect` processes its tokens.

With overlap, batch N+1 is launched before batch N is collected: a request that hits EOS in
batch N is then in batch N+1 too, whose token for it is dropped and whose collect frees it.
"""

from __future__ import annotations

import numpy as np

from ..clocks import RunClock, StageClock
from ..config import EngineConfig
from ..core import Admissions, Batch, PendingReq, Req, SamplingParams
from ..engine.engine import Engine, Launch
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
    """A step failed in `stage` (one of `clocks.STAGES`); its batch's requests ended with
    finish_reason "error" and were freed, and the engine keeps serving the others."""

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
        """`probe`: told of every step (None: nobody watches); `config`: overrides the engine's
        (`LLM.reconfigure`); `clock`: the run's time axis (a twin's is predicted time)."""
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
        self.eos_ids = engine.model_config.eos_token_ids
        self.finished: dict[int, Req] = {}  # uid -> request, until the caller collects it
        self.in_flight: StepRecord | None = None  # overlap: launched, not collected yet
        self.previous: Batch | None = None
        self.watch: Observer | None = None  # the probe, while it hears of a step's inside
        self.step_index = 0
        self._next_uid = 0

    @property
    def eos_ids(self) -> frozenset[int]:
        """The tokens that end a request (unless it ignores EOS); settable."""
        return self._eos_ids

    @eos_ids.setter
    def eos_ids(self, ids) -> None:
        self._eos_ids = frozenset(ids)

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
        """Queue a validated request; it takes resources only once admitted."""
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
        probe = self.probe
        if probe is not None and probe.at_end:
            record.stages.enter("record")
            probe.step_end(record)
        return record

    def launch(self) -> StepRecord | None:
        """Schedule a batch, allocate its pages, and enqueue its forward and sampling."""
        watch, index = self.watch, self.step_index
        # NOTE: the step starts before its first profiler range opens: events go to the step
        # whose start precedes them
        started = self.clock.now()
        stages = StageClock(ranges=watch is not None and watch.profiling)
        batch, admissions = self.schedule_next_batch()
        if watch is not None:
            watch.schedule_end(index, batch, admissions, started, self.occupancy)
            stages.ranges = watch.profiling
        if batch is None:
            self._check_not_stuck(admissions)
            return None
        previous, self.previous = self.previous, None
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
        # NOTE: safe before the forward ran (readers launch later on the same stream), and a
        # chunk's continuation, scheduled before this batch is collected, needs the new handle.
        for req in batch.prefill_reqs:
            self.cache_prefix(req)

    def schedule_next_batch(self) -> tuple[Batch | None, Admissions]:
        config = self.config
        state = SchedulerState(
            self.prefill.queue, list(self.decode.running), config.max_extend_tokens, self._admit
        )
        return policy(config.policy)(state)

    def _admit(self, token_budget: int) -> tuple[list[Req], Admissions]:
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
        """Wait for a launched batch's tokens; append them, finish requests, free them."""
        watch, probe, batch, stages = self.watch, self.probe, record.batch, record.stages
        stages.ranges = watch is not None and watch.profiling
        index, launch = record.step, record.launch
        start = self.clock.now()
        try:
            stages.enter("wait")
            self.engine.wait(launch)
            if probe is not None and probe.at_end:
                # NOTE: read here, else a step that sampled nothing waits in the record stage
                record.device_ms = launch.timer.elapsed_ms()
            waited = self.clock.now() - start
            stages.enter("collect")
            raw = launch.tokens.tolist()
            logprobs = _row_logprobs(batch.sampled_reqs, launch)
            prompt_logprobs = None
            if launch.prompt_logprob_values is not None:
                prompt_logprobs = _give_prompt_logprobs(batch, launch)
            if watch is not None:
                watch.sample_end(index, batch, raw, start, logprobs, prompt_logprobs)
                if launch.routing is not None:
                    watch.moe_route(index, launch)
            tokens, ends = self._append_tokens(batch, raw)
            if logprobs is not None:
                for req, token, entry in zip(batch.sampled_reqs, tokens, logprobs):
                    if token is not None and entry is not None:  # (None: past its end)
                        req.logprobs.append(entry)
            finishes = []
            for req, reason in ends:  # NOTE: all end before any hook runs (Ctrl-C in one)
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
        """Append each sampled token (None past a request's end); return those that end."""
        reqs, eos_ids = batch.sampled_reqs, self._eos_ids
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
        if not eos_ids.isdisjoint(raw):  # (rare: an array of the EOS hits only then)
            last = last | np.array([t in eos_ids for t in raw], dtype=bool)
        may_end = np.flatnonzero(last)
        ends = []
        for i in may_end.tolist():
            req, token = reqs[i], tokens[i]
            reason = None if token is None else req.end_reason(token, eos_ids)
            if reason is not None:
                ends.append((req, reason))
        return tokens, ends

    def _free_finished(self, batch: Batch) -> None:
        # NOTE: a request in the batch in flight still uses its pages; that collect frees it.
        ended = [r for r in batch.reqs if r.finish_reason is not None and not r.released]
        if not ended:
            return
        still_used = set(self.in_flight.batch.reqs) if self.in_flight is not None else set()
        for req in ended:
            if req not in still_used:
                self.free_req(req)

    @property
    def free_slots(self) -> int:
        """Request slots free under `max_running_reqs` (`reconfigure` may lower it)."""
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

    def _evicted(self, requested: int, freed: int) -> None:
        self.watch.cache_evict(self.step_index, requested, freed)

    def cache_prefix(self, req: Req) -> None:
        inserted, kept = self.cache.share_prompt(req, self.table)
        if inserted and self.watch is not None:
            self.watch.cache_insert(self.step_index, req.uid, inserted, kept)

    def free_req(self, req: Req) -> None:
        inserted, kept = self.cache.free_req(req, self.table)
        if inserted and self.watch is not None:
            self.watch.cache_insert(self.step_index, req.uid, inserted, kept)

    def _ended(self, req: Req) -> None:
        self.decode.running.pop(req, None)
        self.finished[req.uid] = req

    def _fail_batch(self, batch: Batch, exc: BaseException, stage: str) -> BaseException:
        """End the batch's live requests with "error"; return the exception to raise."""
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
                continue
            if other is None:
                self.free_req(req)
                continue
            # NOTE: a prompt's chunks share one row; the later holds every page of the earlier.
            other.finish_reason, other.error = req.finish_reason, req.error
            self.decode.running.pop(other, None)
            keep, drop = (req, other) if req.alloc_len >= other.alloc_len else (other, req)
            self.free_req(keep)
            drop.released = True
        dropped = {r.uid for r in failed}
        self.prefill.queue = [p for p in self.prefill.queue if p.uid not in dropped]
        if self.probe is not None:
            now = self.clock.now()
            for req in failed:
                self.probe.request_finish(self.step_index, req, between_steps=True, seconds=now)
        if not isinstance(exc, Exception):
            return exc
        return StepError(stage, [r.uid for r in failed], message)

    def abort(self, uid: int) -> Req:
        """End a request wherever it is with finish_reason "abort"; its slot and pages are freed
        now, or when the batch in flight that still computes for it is collected."""
        if uid in self.finished:
            raise ValueError(
                f"request {uid} has already finished ({self.finished[uid].finish_reason})"
            )
        in_flight = self.in_flight.batch.reqs if self.in_flight is not None else []
        pending = next((p for p in self.prefill.queue if p.uid == uid), None)
        if pending is not None:
            self.prefill.queue.remove(pending)
            req = pending.chunked
            if req is None:
                ids = list(pending.token_ids)
                req = Req(uid, ids, len(ids), -1, 0, pending.sampling, CacheHandle())
        else:
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

    def close(self) -> None:
        """After `abort_all`, before the engine closes: the cache's callback into this scheduler
        dropped, so that what they hold is freed as they are dropped, with no cycle to collect."""
        self.cache.on_evict = self.watch = None

    def check_integrity(self) -> None:
        """Assert every KV page is free, cached, or used by exactly one live request."""
        holders = {id(r): r for r in self.live_reqs}
        if self.in_flight is not None:
            holders |= {id(r): r for r in self.in_flight.batch.reqs if not r.released}
        check_integrity(self.cache, self.table, list(holders.values()))
        self.engine.check_ranks()


def _give_prompt_logprobs(batch: Batch, launch: Launch) -> list | None:
    """Each prompt position's log probabilities of this step to its request's
    `Req.prompt_logprobs` (its prompt's next token's, and the most likely there). Returns, per
    sampled request, its whole prompt's (None first) where this step ran its prompt's end."""
    _, _, counts = launch.prompt_logprobs
    chosen, values, ids = (t.tolist() for t in launch.prompt_logprob_values)
    at = 0
    for req, n in zip(batch.reqs, counts.tolist()):
        if not n:
            continue
        top = req.sampling.prompt_logprobs
        req.prompt_logprobs.extend(_entry(chosen, values, ids, i, top) for i in range(at, at + n))
        at += n
    first = batch.num_decode  # (the sampled requests after the decoding ones ran their prompt)
    out = [
        None if i < first or r.prompt_logprobs is None else [None, *r.prompt_logprobs]
        for i, r in enumerate(batch.sampled_reqs)
    ]
    return out if any(e is not None for e in out) else None


def _row_logprobs(reqs: list[Req], launch: Launch) -> list | None:
    """Per sampled request, its token's log probability and the most likely tokens there, as
    many as it asked (`Req.logprobs`' entries); None for one that did not ask, or for all."""
    if launch.logprob_values is None:
        return None
    rows, _ = launch.logprobs
    chosen, values, ids = (t.tolist() for t in launch.logprob_values)
    out: list = [None] * len(reqs)
    for j, i in enumerate(rows.tolist()):
        out[i] = _entry(chosen, values, ids, j, reqs[i].sampling.logprobs)
    return out


def _entry(chosen: list, values: list, ids: list, i: int, top: int) -> tuple:
    """Row `i`'s log probability entry: its token's, and the `top` most likely as (id, value)."""
    return chosen[i], list(zip(ids[i][:top], values[i][:top]))
