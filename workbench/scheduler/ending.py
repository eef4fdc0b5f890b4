"""Ending requests before their last token: an abort, or a step that failed.

Either way the request ends with the tokens it has, and its slot and KV pages are freed now,
or, when a launched batch still computes for it (overlap), when that batch is collected: nothing
a batch in flight writes to is handed out again before it is done. The engine keeps serving.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..core import Batch, Req
from ..kvcache.base import CacheHandle
from ..stages import StageClock
from .outcome import InFlight, StepError

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from .decode import DecodeManager
    from .observer import Observer
    from .prefill import PrefillManager


class EarlyEnds:
    """The Scheduler's part that ends requests early (a mixin: it shares the scheduler's
    state, declared here)."""

    engine: Engine
    probe: Observer
    prefill: PrefillManager
    decode: DecodeManager
    finished: dict[int, Req]
    in_flight: InFlight | None
    step_index: int

    def free_req(self, req: Req) -> None: ...  # the Scheduler's

    def _end(self, req: Req) -> None:
        """A request has its finish reason: out of the running set, into `finished`."""
        self.decode.running.pop(req, None)
        self.finished[req.uid] = req

    @contextlib.contextmanager
    def _all_or_nothing(self, batch: Batch, clock: StageClock) -> Iterator[None]:
        """A step is all or nothing: a failure inside ends the batch's requests (`_fail_batch`)
        and reaches the caller as a StepError naming them and the stage that failed (the
        clock's), or as it was (an interrupt)."""
        try:
            yield
        except BaseException as exc:
            error = self._fail_batch(batch, exc, clock.stage)
            if error is exc:
                raise
            raise error from exc

    def _fail_batch(self, batch: Batch, exc: BaseException, stage: str) -> BaseException:
        """Every request of the batch that had not ended ends with finish_reason "error", and
        what it holds is freed now, or once the batch in flight that still computes for it is
        collected. Returns the exception for the caller: a StepError naming the requests, or
        a KeyboardInterrupt (and the like) as it was."""
        message = f"{type(exc).__name__}: {exc}"
        in_flight = {r.uid: r for r in self.in_flight.batch.reqs} if self.in_flight else {}
        failed = []
        for req in batch.reqs:
            if req.finish_reason is None:
                req.finish_reason, req.error = "error", message
                self._end(req)
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
        for req in failed:
            self.probe.request_finish(self.step_index, req, between_steps=True)
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
        self._end(req)
        if req.table_idx >= 0 and req not in in_flight:
            self.free_req(req)
        self.probe.request_finish(self.step_index, req, between_steps=True)
        return req
