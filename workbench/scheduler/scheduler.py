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

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import EngineConfig
from ..core import Admissions, Batch, Req, ReqView, SamplingParams, ceil_page
from ..device import DeviceTimer, to_device_many
from ..engine.engine import Engine
from ..instrument import events as ev
from ..instrument.history import History
from ..instrument.hooks import HookRegistry
from ..instrument.profiler import StepProfiler
from ..instrument.recorder import build_record
from ..kvcache import create_prefix_cache
from ..kvcache.base import CacheHandle
from .cache import CacheManager
from .decode import DecodeManager
from .integrity import check_integrity
from .policy import schedule_next_batch
from .prefill import PendingReq, PrefillManager
from .prepare import prepare_batch

RECORD_LEVELS = ("off", "light", "full")


class StepError(RuntimeError):
    """A scheduler step failed; the requests of its batch ended with finish_reason "error" and
    gave back what they held. The engine keeps serving the others."""

    def __init__(self, stage: str, uids: list[int], message: str) -> None:
        self.stage, self.uids = stage, uids
        super().__init__(
            f"a step failed in {stage} ({message}); requests {uids} ended with "
            'finish_reason="error" and their KV pages and slots were freed'
        )


@dataclass
class InFlight:
    """A launched batch whose tokens have not been processed yet."""

    index: int
    batch: Batch
    rows: list[ReqView]  # the ledgers as launched
    admissions: Admissions
    tokens: torch.Tensor  # host copy of the sampled tokens (filled asynchronously on a GPU)
    done: torch.cuda.Event | None  # recorded after the copy; None on the CPU
    launched_at: float
    timer: DeviceTimer
    padded_size: int
    cuda_graph: bool
    overlapped: bool = False  # set when the next batch is launched before this is collected
    page_rows: dict[int, tuple[int, ...]] | None = None  # record="full"
    launch_ms: float = 0.0  # host time to schedule, prepare and enqueue this batch


@dataclass
class StepOutcome:
    """What one scheduler step did; `record` is its StepRecord when recording is on."""

    index: int
    batch: Batch
    rows: list[ReqView]  # the batch's ledgers as launched (before the forward moved them)
    admissions: Admissions
    tokens: list[int | None]  # per sampled request; None where dropped (past its end)
    finished: list[Req]  # requests whose last token came from this batch
    launched: InFlight
    completed_at: float
    record: Any = None
    # host time in collect: blocked on the device's tokens, then processing them. With overlap,
    # waiting near zero means the host is the bottleneck; a long wait, the device.
    wait_ms: float = 0.0
    collect_ms: float = 0.0


class Scheduler:
    def __init__(self, engine: Engine, record: str = "off", config: EngineConfig | None = None):
        """`config`: the scheduler's settings (policy, token budget, cache, overlap), when they
        differ from those the engine was built with (`LLM.reconfigure`)."""
        if record not in RECORD_LEVELS:
            raise ValueError(f"record must be one of {RECORD_LEVELS}, got {record!r}")
        cfg = config if config is not None else engine.config
        self.engine, self.config = engine, cfg
        self.table = engine.table
        self.page_size = cfg.page_size
        self.overlap = cfg.overlap_enabled
        self.cache = CacheManager(
            engine.num_pages, cfg.page_size, create_prefix_cache(cfg.cache, cfg.page_size)
        )
        self.cache.on_evict = self._on_evict
        self.prefill = PrefillManager()
        self.decode = DecodeManager(cfg.page_size)
        self.eos_ids = frozenset(engine.model_config.eos_token_ids)
        self.finished: dict[int, Req] = {}  # uid -> request, until the caller collects it
        self.in_flight: InFlight | None = None  # overlap: the batch launched but not collected
        self.hooks = HookRegistry()
        self.record = record
        self.history = History()
        self.step_index = 0
        self._stage = "prepare"  # where launch is: names the stage of a step that fails
        self._next_uid = 0
        self._t0 = time.perf_counter()

    def clock(self) -> float:
        """Seconds since the scheduler started (or was reset): the time axis of the records."""
        return time.perf_counter() - self._t0

    def _range(self, name: str):
        # profiler ranges only while recording in full (the profiler is on then)
        return torch.profiler.record_function(name) if self.record == "full" else _NULL

    # -- requests ---------------------------------------------------------------------------
    def new_uid(self) -> int:
        uid, self._next_uid = self._next_uid, self._next_uid + 1
        return uid

    def add_request(
        self, token_ids: list[int], sampling: SamplingParams, uid: int | None = None
    ) -> int:
        """Queue a validated request; resources are taken only when it is admitted."""
        uid = self.new_uid() if uid is None else uid
        self.prefill.add(PendingReq(uid, list(token_ids), sampling))
        self.history.arrive(uid, self.step_index, self.clock(), len(token_ids), sampling.max_tokens)
        if "request.arrive" in self.hooks:
            self.hooks.emit(
                "request.arrive",
                ev.RequestArrive(self.step_index, uid, len(token_ids), sampling.max_tokens),
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
        record="full" the step runs under torch.profiler and its record carries the events.
        """
        if self.record != "full":
            outcome = self._step()
            return None if outcome is None else self._finish(outcome)
        with StepProfiler(self) as prof:
            outcome = self._step()
        return None if outcome is None else self._finish(outcome, prof.events())

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

    def _finish(self, outcome: StepOutcome, events: tuple | None = None) -> StepOutcome:
        """Build the step's record (when recording or when someone listens to step.end)."""
        if self.record == "off" and "step.end" not in self.hooks:
            return outcome
        with self._range("step.end"):
            record = build_record(self, outcome, events)
            if self.record != "off":
                self.history.append(record)
            outcome.record = record
        if "step.end" in self.hooks:
            self.hooks.emit("step.end", record)
        return outcome

    def launch(self) -> InFlight | None:
        launched_at = self.clock()
        with self._range("schedule.end"):
            batch, admissions = self.schedule_next_batch()
        self._emit_admissions(batch, admissions)
        if batch is None:
            if self.prefill.queue and not self.decode.running and self.in_flight is None:
                head = self.prefill.queue[0]
                raise RuntimeError(
                    f"request {head.uid} can never be admitted ({admissions.decided[0].reason}); "
                    "it should have been rejected when it was added"
                )
            return None
        self._stage = "prepare"
        try:
            return self._launch(batch, admissions, launched_at)
        except BaseException as exc:
            error = self._fail_batch(batch, exc, self._stage)
            if error is exc:
                raise
            raise error from exc

    def _launch(self, batch: Batch, admissions: Admissions, launched_at: float) -> InFlight:
        hooks, step = self.hooks, self.step_index
        with self._range("batch.prepared"):
            new_pages = prepare_batch(self, batch)
            rows = batch.views()
        page_rows = None
        if self.record == "full":  # snapshot now: with overlap the rows change before collect
            table = self.table.page_table_host
            page_rows = {
                r.table_idx: tuple(table[r.table_idx, : r.device_len].tolist()) for r in rows
            }
        if "batch.prepared" in hooks:
            num_tokens = sum(r.extend_len for r in rows)
            hooks.emit(
                "batch.prepared",
                ev.BatchPrepared(step, batch.phase, tuple(rows), num_tokens, new_pages),
            )
        graph = self.engine.uses_graph(batch) and self.config.cuda_graph_enabled
        if "forward.begin" in hooks:
            num_tokens = sum(r.extend_len for r in rows)
            hooks.emit(
                "forward.begin", ev.ForwardBegin(step, batch.phase, batch.size, num_tokens, graph)
            )
        timer = self.engine.timer()
        with self._range("forward.end"):
            timer.start()
            self._stage = "forward"
            logits = self.engine.forward(batch)
            for req in batch.reqs:
                req.complete_one()
            self._stage = "sample"
            tokens, done = self.sample(batch, logits)
            timer.stop()
        self._stage = "cache"
        if "forward.end" in hooks:
            ledger = tuple(batch.views())
            hooks.emit("forward.end", ev.ForwardEnd(step, batch.phase, ledger))
        if batch.is_prefill and self.cache.shares:
            # NOTE: safe before the forward has run: any batch that reads these pages is
            # launched later on the same stream. Doing it now (not at collect) also hands the
            # new handle to a chunk's continuation, which is scheduled before this is collected.
            for req in batch.prefill_reqs:
                self.cache_prefix(req)
        self.decode.filter_reqs(batch.reqs)
        self.step_index += 1
        padded = self.engine.padded_size(batch)
        return InFlight(
            step,
            batch,
            rows,
            admissions,
            tokens,
            done,
            launched_at,
            timer,
            padded,
            graph,
            page_rows=page_rows,
            launch_ms=(self.clock() - launched_at) * 1e3,
        )

    def schedule_next_batch(self) -> tuple[Batch | None, Admissions]:
        """The configured policy's batch and the admission decisions behind it."""
        return schedule_next_batch(self)

    def sample(
        self, batch: Batch, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Sample the next token of every request that finished its prompt and write it into the
        token pool, where the next decode step reads it; start copying the tokens to the host."""
        reqs = batch.sampled_reqs
        if not reqs:
            return torch.zeros(0, dtype=torch.int32), None
        sampler, device = self.engine.sampler, self.engine.device
        tokens = sampler.sample(logits, sampler.prepare(reqs))
        rows, cols = to_device_many(
            [[r.table_idx for r in reqs], [r.device_len - 1 for r in reqs]], device
        )
        self.table.token_pool[rows, cols] = tokens
        if device.type != "cuda":
            return tokens, None
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done

    def collect(self, launched: InFlight) -> StepOutcome:
        """Process a launched batch's tokens: append, finish, free what nothing uses any more."""
        try:
            return self._collect(launched)
        except BaseException as exc:
            error = self._fail_batch(launched.batch, exc, "collect")
            if error is exc:
                raise
            raise error from exc

    def _collect(self, launched: InFlight) -> StepOutcome:
        start = self.clock()
        with self._range("sample.end"):
            if launched.done is not None:
                launched.done.synchronize()
            waited = self.clock() - start
            raw = launched.tokens.tolist()
        batch, step, hooks = launched.batch, launched.index, self.hooks
        if "sample.end" in hooks:
            uids = tuple(r.uid for r in batch.sampled_reqs)
            hooks.emit("sample.end", ev.SampleEnd(step, uids, tuple(raw)))
        tokens: list[int | None] = []
        finished = []
        for req, token in zip(batch.sampled_reqs, raw):
            if req.finish_reason is not None:
                tokens.append(None)  # overlap: it finished in the batch before; past its end
                continue
            tokens.append(token)
            req.append_host(token)
            if token in self.eos_ids and not req.sampling.ignore_eos:
                req.finish_reason = "stop"
            # NOTE: the host's count, not remain_len: with overlap the device side is already a
            # step ahead, and remain_len would end the request one token early.
            elif len(req.token_ids) == req.max_device_len:
                req.finish_reason = "length"
            if req.finish_reason is not None:
                self.decode.running.pop(req, None)
                self.finished[req.uid] = req
                finished.append(req)
                if "request.finish" in hooks:
                    hooks.emit(
                        "request.finish",
                        ev.RequestFinish(
                            step,
                            req.uid,
                            req.finish_reason,
                            req.prompt_len,
                            req.cached_tokens,
                            req.output_len,
                        ),
                    )
        # NOTE: a finished request in the batch launched after this one still uses its slot
        # and pages; that batch's collect frees them. All rows, not only the sampled ones: an
        # aborted chunk is freed here too.
        still_used = set(self.in_flight.batch.reqs) if self.in_flight is not None else set()
        for req in batch.reqs:
            if req.finish_reason is not None and not req.released and req not in still_used:
                self.free_req(req)
        end = self.clock()
        return StepOutcome(
            step,
            batch,
            launched.rows,
            launched.admissions,
            tokens,
            finished,
            launched,
            end,
            wait_ms=waited * 1e3,
            collect_ms=(end - start - waited) * 1e3,
        )

    def cache_prefix(self, req: Req) -> None:
        """Share the full pages of a prompt computed so far, while its request keeps running.

        Where the cache already held some of those tokens (another request computed them too),
        the request's row is pointed at the cache's slots: its own copies were freed.
        """
        row = self.table.page_table_host[req.table_idx]
        n = ceil_page(req.cached_len, self.page_size)
        before = req.cache_handle.cached_len
        handle, slots, kept = self.cache.cache_running(
            req.token_ids, req.cached_len, row[:n].copy(), req.cache_handle
        )
        req.cache_handle = handle
        changed = np.flatnonzero(row[: len(slots)] != slots)
        if len(changed):
            lo, hi = int(changed[0]), int(changed[-1]) + 1
            self.table.write_row(req.table_idx, lo, slots[lo:hi])
        if "cache.insert" in self.hooks and handle.cached_len > before:
            event = ev.CacheInsert(self.step_index, req.uid, handle.cached_len, kept)
            self.hooks.emit("cache.insert", event)

    def free_req(self, req: Req) -> None:
        """Give back a request's slot and pages; its computed full pages go to the prefix cache,
        unless it failed (then its KV may be incomplete and nothing of it is shared)."""
        assert not req.released, f"request {req.uid} released twice"
        req.released = True
        row_slots = self.table.page_table_host[req.table_idx, : req.alloc_len].copy()
        if req.finish_reason == "error":
            self.cache.discard(row_slots, req.cache_handle)
            self.table.free(req.table_idx)
            return
        inserted, kept = self.cache.release(
            req.token_ids, req.cached_len, row_slots, req.cache_handle
        )
        self.table.free(req.table_idx)
        if "cache.insert" in self.hooks and self.cache.shares and inserted:
            self.hooks.emit(
                "cache.insert", ev.CacheInsert(self.step_index, req.uid, inserted, kept)
            )

    def _fail_batch(self, batch: Batch, exc: BaseException, stage: str) -> BaseException:
        """A step failed part-way: every request of its batch that had not ended ends with
        finish_reason "error", and what it holds is freed now, or once the batch in flight that
        still computes for it is collected. The engine keeps serving; the returned exception
        (a StepError naming the requests, or a KeyboardInterrupt as it was) is for the caller."""
        message = f"{type(exc).__name__}: {exc}"
        in_flight = {r.uid: r for r in self.in_flight.batch.reqs} if self.in_flight else {}
        failed = []
        for req in batch.reqs:
            if req.finish_reason is None:
                req.finish_reason, req.error = "error", message
                self.decode.running.pop(req, None)
                self.finished[req.uid] = req
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
            keep, drop = (req, other) if req.alloc_len >= other.alloc_len else (other, req)
            self.free_req(keep)
            drop.released = True
        dropped = {r.uid for r in failed}
        self.prefill.queue = [p for p in self.prefill.queue if p.uid not in dropped]
        for req in failed:
            self.history.abort(req.uid, self.step_index, self.clock(), "error")
            if "request.finish" in self.hooks:
                self.hooks.emit(
                    "request.finish",
                    ev.RequestFinish(
                        self.step_index,
                        req.uid,
                        "error",
                        req.prompt_len,
                        req.cached_tokens,
                        req.output_len,
                    ),
                )
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
            self.decode.running.pop(req, None)
        req.finish_reason = "abort"
        self.finished[uid] = req
        if req.table_idx >= 0 and req not in in_flight:
            self.free_req(req)
        self.history.abort(uid, self.step_index, self.clock())
        if "request.finish" in self.hooks:
            self.hooks.emit(
                "request.finish",
                ev.RequestFinish(
                    self.step_index, uid, "abort", req.prompt_len, req.cached_tokens, req.output_len
                ),
            )
        return req

    # -- hook helpers -----------------------------------------------------------------------
    def _emit_admissions(self, batch: Batch | None, admissions: Admissions) -> None:
        hooks, step = self.hooks, self.step_index
        if "admit" in hooks and batch is not None:
            by_uid = {r.uid: r for r in batch.reqs}
            for a in admissions.decided:  # the requests behind were all refused
                if a.admitted:
                    req = by_uid[a.uid]
                    kind = ReqView.of(req, decoding=False).kind
                    hooks.emit(
                        "admit",
                        ev.Admit(step, a.uid, kind, a.cached_len, a.extend_len, req.table_idx),
                    )
        if "reject" in hooks:
            for a in admissions:
                if not a.admitted:
                    hooks.emit("reject", ev.Reject(step, a.uid, a.reason))
        if "schedule.end" in hooks and (batch is not None or admissions):
            admitted = sum(a.admitted for a in admissions.decided)
            phase = None if batch is None else batch.phase
            uids = () if batch is None else tuple(r.uid for r in batch.reqs)
            hooks.emit(
                "schedule.end",
                ev.ScheduleEnd(step, phase, uids, admitted, len(admissions) - admitted),
            )

    def _on_match(self, uid: int, prompt_len: int, cached_len: int) -> None:
        self.hooks.emit("cache.match", ev.CacheMatch(self.step_index, uid, prompt_len, cached_len))

    def _on_evict(self, requested: int, freed: int) -> None:
        if "cache.evict" in self.hooks:
            self.hooks.emit("cache.evict", ev.CacheEvict(self.step_index, requested, freed))

    # -- lifecycle and checks ---------------------------------------------------------------
    def abort_all(self) -> None:
        """Drop every request, free what they hold, and empty the prefix cache."""
        self.flush()
        for req in self.live_reqs:
            self.free_req(req)
        self.prefill.queue.clear()
        self.decode.running.clear()
        self.finished.clear()
        self.cache.evict(self.cache.total_size)
        self.step_index = 0
        self._t0 = time.perf_counter()
        self.history = History()

    def check_integrity(self) -> None:
        """KV pool accounting: every page free, cached, or used by exactly one request that
        holds it (running, part-way through its prompt, or in the batch in flight); any time
        between steps, with overlap too."""
        holders = {id(r): r for r in self.live_reqs}
        if self.in_flight is not None:  # ended requests wait there for the batch to complete
            holders |= {id(r): r for r in self.in_flight.batch.reqs if not r.released}
        check_integrity(self.cache, self.table, list(holders.values()))


_NULL = contextlib.nullcontext()
