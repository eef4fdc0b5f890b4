"""Batch policies: which requests share the next batch. One function each, in its own file, and
one line in `POLICIES` (name -> "module:function", imported on first use; `config.py` checks
names against it, the scheduler calls the function every step).

A policy gets the scheduler's state (`SchedulerState`: the queue, the running requests, the
token budget, and `admit`, which runs the admission checks over the queue for a token budget)
and returns the batch to run next (None: nothing to run) with the admission decisions behind it.
It decides what to run, never how: admission (slots, KV space, chunking) is the scheduler's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from functools import cache
from typing import NamedTuple

from ..core import Admissions, Batch, PendingReq, Req

POLICIES = {
    "prefill_first": "workbench.policies.prefill_first:prefill_first",
    "decode_first": "workbench.policies.decode_first:decode_first",
    "mixed": "workbench.policies.mixed:mixed",
}


class SchedulerState(NamedTuple):
    """What a policy sees of the scheduler when it picks the next batch."""

    queue: Sequence[PendingReq]  # waiting, in arrival order (a prompt part-way first)
    running: list[Req]  # decoding, in the order they joined
    max_extend_tokens: int  # the token budget of a batch
    # admission over the queue with this token budget: the requests admitted (or continued:
    # chunks) and every decision, each refusal with its reason
    admit: Callable[[int], tuple[list[Req], Admissions]]


Policy = Callable[[SchedulerState], tuple[Batch | None, Admissions]]


@cache
def policy(name: str) -> Policy:
    """The policy registered under `name`."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; expected one of {sorted(POLICIES)}")
    module, function = POLICIES[name].split(":")
    return getattr(importlib.import_module(module), function)
