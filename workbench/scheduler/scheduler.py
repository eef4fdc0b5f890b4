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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core import Batch, ChunkedReq, Req, ReqView, SamplingParams
from ..engine.engine import Engine
from ..engine.transfer import to_device
from ..kvcache import create_prefix_cache
from .cache import CacheManager, ceil_page
from .decode import DecodeManager
from .prefill import Admission, PendingReq, PrefillAdder, PrefillManager


@dataclass(frozen=True)
class StepOutcome:
    """What one scheduler step did (the raw material of the workbench's records)."""

    index: int
    batch: Batch
    rows: list[ReqView]  # the batch's ledgers as launched (before the forward moved them)
    admissions: list[Admission]
    tokens: list[int]  # one per sampled request, in `batch.sampled_reqs` order
    finished: list[Req]  # requests whose last token came from this batch


@dataclass
class InFlight:
    """A launched batch whose tokens have not been processed yet."""

    index: int
    batch: Batch
    rows: list[ReqView]
    admissions: list[Admission]
    tokens: torch.Tensor  # host copy of the sampled tokens (filled asynchronously on a GPU)
    done: torch.cuda.Event | None  # recorded after the copy; None on the CPU


class Scheduler:
    def __init__(self, engine: Engine) -> None:
        cfg = engine.config
        self.engine, self.config = engine, cfg
        self.table = engine.table
        self.page_size = cfg.page_size
        self.overlap = cfg.overlap_enabled
        self.cache = CacheManager(
            engine.num_pages, cfg.page_size, create_prefix_cache(cfg.cache, cfg.page_size)
        )
        self.prefill = PrefillManager()
        self.decode = DecodeManager(cfg.page_size)
        self.eos_ids = frozenset(engine.model_config.eos_token_ids)
        self.finished: dict[int, Req] = {}  # uid -> request, until the caller collects it
        self.in_flight: InFlight | None = None  # overlap: the batch launched but not collected
        self.step_index = 0
        self._next_uid = 0

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, token_ids: list[int], sampling: SamplingParams) -> int:
        """Queue a validated request; resources are taken only when it is admitted."""
        uid = self._next_uid
        self._next_uid += 1
        self.prefill.add(PendingReq(uid, list(token_ids), sampling))
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

        With overlap, the batch after it is already launched when this returns.
        """
        if not self.overlap:
            launched = self.launch()
            return None if launched is None else self.collect(launched)
        if self.in_flight is None:
            self.in_flight = self.launch()
            if self.in_flight is None:
                return None
        current, self.in_flight = self.in_flight, self.launch()
        return self.collect(current)

    def flush(self) -> StepOutcome | None:
        """Collect the batch in flight (overlap) without launching another."""
        if self.in_flight is None:
            return None
        current, self.in_flight = self.in_flight, None
        return self.collect(current)

    def launch(self) -> InFlight | None:
        batch, admissions = self.schedule_next_batch()
        if batch is None:
            if self.prefill.queue and not self.decode.running and self.in_flight is None:
                head = self.prefill.queue[0]
                raise RuntimeError(
                    f"request {head.uid} can never be admitted ({admissions[0].reason}); "
                    "it should have been rejected when it was added"
                )
            return None
        self.prepare_batch(batch)
        rows = batch.views()
        logits = self.engine.forward(batch)
        for req in batch.reqs:
            req.complete_one()
        tokens, done = self.sample(batch, logits)
        if batch.is_prefill and self.cache.shares:
            # NOTE: safe before the forward has run: any batch that reads these pages is
            # launched later on the same stream. Doing it now (not at collect) also hands the
            # new handle to a chunk's continuation, which is scheduled before this is collected.
            for req in batch.reqs:
                self.cache_prefix(req)
        self.decode.filter_reqs(batch.reqs)
        self.step_index += 1
        return InFlight(self.step_index - 1, batch, rows, admissions, tokens, done)

    def schedule_next_batch(self) -> tuple[Batch | None, list[Admission]]:
        """Prefill first: a prefill batch if anything can be admitted, else a decode batch."""
        admissions: list[Admission] = []
        if self.prefill.queue:
            adder = PrefillAdder(
                token_budget=self.config.max_extend_tokens,
                reserved_size=self.decode.reserved_size,
                cache=self.cache,
                table=self.table,
                share_threshold=self.config.share_threshold if self.cache.shares else 0,
            )
            reqs, admissions = self.prefill.schedule(adder)
            if reqs:
                return Batch(reqs, "prefill"), admissions
        if self.decode.running:
            return Batch(list(self.decode.running), "decode"), admissions
        return None, admissions

    def prepare_batch(self, batch: Batch) -> None:
        """Allocate KV pages for the new tokens, then build positions, inputs and out_loc."""
        ps, reqs, device = self.page_size, batch.reqs, self.engine.device
        first = np.array([ceil_page(r.cached_len, ps) for r in reqs])  # allocated before this batch
        end = np.array([ceil_page(r.device_len, ps) for r in reqs])
        new_pages = (end - first) // ps
        if new_pages.sum() > 0:
            pages = self.cache.allocate_pages(int(new_pages.sum()))
            slots = (pages[:, None] * ps + np.arange(ps)).reshape(-1)
            rows = np.repeat([r.table_idx for r in reqs], new_pages * ps)
            cols = np.concatenate([np.arange(a, b) for a, b in zip(first, end)])
            self.table.write_slots(rows, cols, slots)

        extend = np.array([r.extend_len for r in reqs])
        positions = np.concatenate([np.arange(r.cached_len, r.device_len) for r in reqs])
        token_rows = np.repeat([r.table_idx for r in reqs], extend)
        out_loc = self.table.page_table_host[token_rows, positions]
        sampled = [not isinstance(r, ChunkedReq) for r in reqs]
        sample_idx = (np.cumsum(extend) - 1)[np.array(sampled, dtype=bool)]

        rows_t, positions_t = to_device(token_rows, device), to_device(positions, device)
        batch.positions = positions_t
        batch.input_ids = self.table.token_pool[rows_t, positions_t]
        batch.out_loc = to_device(out_loc, device)
        batch.sample_idx = to_device(sample_idx, device)
        self.engine.prepare(batch)

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
        rows = to_device([r.table_idx for r in reqs], device)
        cols = to_device([r.device_len - 1 for r in reqs], device)
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
        if launched.done is not None:
            launched.done.synchronize()
        tokens = launched.tokens.tolist()
        batch, finished = launched.batch, []
        for req, token in zip(batch.sampled_reqs, tokens):
            if req.finish_reason is not None:
                continue  # overlap: it finished in the batch before; this token is past its end
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
        # NOTE: a finished request in the batch launched after this one still uses its slot
        # and pages; that batch's collect frees them.
        still_used = set(self.in_flight.batch.reqs) if self.in_flight is not None else set()
        for req in batch.sampled_reqs:
            if req.finish_reason is not None and req not in still_used:
                self.free_req(req)
        return StepOutcome(
            launched.index, batch, launched.rows, launched.admissions, tokens, finished
        )

    def cache_prefix(self, req: Req) -> None:
        """Share the full pages of a prompt computed so far, while its request keeps running.

        Where the cache already held some of those tokens (another request computed them too),
        the request's row is pointed at the cache's slots: its own copies were freed.
        """
        row = self.table.page_table_host[req.table_idx]
        n = ceil_page(req.cached_len, self.page_size)
        handle, slots = self.cache.cache_running(
            req.token_ids, req.cached_len, row[:n].copy(), req.cache_handle
        )
        req.cache_handle = handle
        changed = np.flatnonzero(row[: len(slots)] != slots)
        if len(changed):
            lo, hi = int(changed[0]), int(changed[-1]) + 1
            self.table.write_row(req.table_idx, lo, slots[lo:hi])

    def free_req(self, req: Req) -> None:
        row_slots = self.table.page_table_host[
            req.table_idx, : ceil_page(req.cached_len, self.page_size)
        ]
        self.cache.release(req.token_ids, req.cached_len, row_slots.copy(), req.cache_handle)
        self.table.free(req.table_idx)

    # -- checks -----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """KV pool accounting: every page free, cached, or used by exactly one live request."""
        assert self.in_flight is None, "check integrity between steps, with nothing in flight"
        used = [
            self.table.page_table_host[
                r.table_idx, r.cache_handle.cached_len : ceil_page(r.cached_len, self.page_size)
            ]
            for r in self.live_reqs
        ]
        self.cache.check_integrity(np.concatenate(used) if used else None)
        for r in self.live_reqs:  # a live row never points at a free page
            slots = self.table.page_table_host[
                r.table_idx, : ceil_page(r.cached_len, self.page_size)
            ]
            stale = self.cache.free_pages_among(slots)
            assert not len(stale), f"request {r.uid}'s page table points at free pages {stale[:8]}"
        rows = {r.table_idx for r in self.live_reqs}
        assert len(rows) == len(self.live_reqs), "two live requests share a request slot"
        assert self.table.available_size + len(rows) == self.table.max_running_reqs, (
            f"request slots: {self.table.available_size} free + {len(rows)} live "
            f"!= {self.table.max_running_reqs}"
        )
