"""Batch policies: which requests share the next batch. One function a file and one line in
`POLICIES`; each maps a `SchedulerState` to the next batch (None: nothing to run) and the admission
decisions behind it. A policy decides what runs, never how: admission is the scheduler's."""

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
    # admission over the queue for a token budget: the requests admitted and every decision
    admit: Callable[[int], tuple[list[Req], Admissions]]


Policy = Callable[[SchedulerState], tuple[Batch | None, Admissions]]


@cache
def policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; expected one of {sorted(POLICIES)}")
    module, function = POLICIES[name].split(":")
    return getattr(importlib.import_module(module), function)
