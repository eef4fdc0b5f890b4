"""Policies: which requests share the next batch.

- ``prefill_first``: a prefill batch if anything can be admitted, else a decode batch; running
  requests pause while prompts are computed.
- ``decode_first``: a decode batch while any request runs; waiting requests are admitted only
  when none does (each is refused with the reason ``decode_first`` until then).
- ``mixed``: every running request decodes, and prefill chunks fill what is left of the token
  budget, in one batch (stall-free batching, as in Sarathi-Serve). Each decode takes one token
  of the budget, so with as many running requests as the budget no prompt is admitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core import DECODE_FIRST, Admission, Admissions, Batch
from .prefill import PrefillAdder

if TYPE_CHECKING:
    from .scheduler import Scheduler


def schedule_next_batch(sched: Scheduler) -> tuple[Batch | None, Admissions]:
    """The batch `sched.config.policy` chooses now (None: nothing to run), and its admissions."""
    policy, queue = sched.config.policy, sched.prefill.queue
    running = list(sched.decode.running)
    admissions = Admissions()
    if queue and policy == "decode_first" and running:
        # NOTE: a prompt part-way through its chunks sits at the head of the queue; it keeps
        # its own decision, which carries how much of it is computed.
        chunked = [p for p in queue[:1] if p.chunked is not None]
        admissions.decided = [
            Admission(p.uid, False, DECODE_FIRST, 0, p.chunked.cached_len) for p in chunked
        ]
        admissions.behind, admissions.behind_reason = queue[len(chunked) :], DECODE_FIRST
    elif queue:
        budget = sched.config.max_extend_tokens
        if policy == "mixed":
            budget = max(0, budget - len(running))
        adder = PrefillAdder(
            token_budget=budget,
            reserved_size=sched.decode.reserved_size,
            cache=sched.cache,
            table=sched.table,
            share_threshold=sched.config.share_threshold if sched.cache.shares else 0,
            on_match=sched._on_match if "cache.match" in sched.hooks else None,
        )
        reqs, admissions = sched.prefill.schedule(adder)
        if reqs and policy == "mixed" and running:
            return Batch(running + reqs, "mixed", num_decode=len(running)), admissions
        if reqs:
            return Batch(reqs, "prefill"), admissions
    if running:
        return Batch(running, "decode"), admissions
    return None, admissions
