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

from collections.abc import Callable

from ..core import DECODE_FIRST, Admission, Admissions, Batch, Req
from .prefill import PrefillAdder, PrefillManager


def schedule_next_batch(
    policy: str,
    max_extend_tokens: int,
    prefill: PrefillManager,
    running: list[Req],
    new_adder: Callable[[int], PrefillAdder],
) -> tuple[Batch | None, Admissions]:
    """The batch `policy` chooses now (None: nothing to run), and its admissions.
    `new_adder(budget)` makes the admission checks for a prefill with that token budget."""
    queue = prefill.queue
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
        budget = max_extend_tokens
        if policy == "mixed":
            budget = max(0, budget - len(running))
        reqs, admissions = prefill.schedule(new_adder(budget))
        if reqs and policy == "mixed" and running:
            return Batch(running + reqs, "mixed", num_decode=len(running)), admissions
        if reqs:
            return Batch(reqs, "prefill"), admissions
    if running:
        return Batch(running, "decode"), admissions
    return None, admissions
