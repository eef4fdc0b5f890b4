"""Batch policies: each maps a `SchedulerState` to the next batch (None: nothing to run) and its
admission decisions. A policy decides what runs, never how: admission is the scheduler's."""

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

    queue: Sequence[PendingReq]  # arrival order, a prompt part-way through first
    running: list[Req]
    max_extend_tokens: int
    admit: Callable[[int], tuple[list[Req], Admissions]]  # admission for a token budget


Policy = Callable[[SchedulerState], tuple[Batch | None, Admissions]]


@cache
def policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; expected one of {sorted(POLICIES)}")
    module, function = POLICIES[name].split(":")
    return getattr(importlib.import_module(module), function)
