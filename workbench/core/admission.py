"""Admission decisions: why a waiting request was or was not admitted to a step's batch."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

NO_TOKEN_BUDGET = "no_token_budget"
NO_SLOT = "no_slot"
KV_FULL = "kv_full"
KV_FULL_AFTER_LOCK = "kv_full_after_lock"
QUEUED_BEHIND = "queued_behind"  # FIFO: a request ahead of it was refused
WAIT_FOR_PREFIX = "wait_for_prefix"  # shares an uncached prefix with a request in this batch
DECODE_FIRST = "decode_first"  # policy="decode_first": requests are running, so they go first
REASONS = (
    NO_TOKEN_BUDGET,
    NO_SLOT,
    KV_FULL,
    KV_FULL_AFTER_LOCK,
    QUEUED_BEHIND,
    WAIT_FOR_PREFIX,
    DECODE_FIRST,
)


class Admission(NamedTuple):
    uid: int
    admitted: bool
    reason: str | None  # None when admitted
    extend_len: int
    cached_len: int


class Admissions:
    """A step's admission decisions in queue order: `decided` one by one, then `behind`, refused
    as a group for `behind_reason` and kept as a slice of the queue until something reads it."""

    __slots__ = ("decided", "behind", "behind_reason")

    def __init__(
        self,
        decided: list[Admission] | None = None,
        behind: Sequence[Any] = (),  # waiting requests (anything with a uid)
        behind_reason: str = QUEUED_BEHIND,
    ) -> None:
        self.decided = decided if decided is not None else []
        self.behind = behind
        self.behind_reason = behind_reason

    def __iter__(self) -> Iterator[Admission]:
        yield from self.decided
        for pending in self.behind:
            yield Admission(pending.uid, False, self.behind_reason, 0, 0)

    def __len__(self) -> int:
        return len(self.decided) + len(self.behind)

    def __repr__(self) -> str:
        return f"Admissions({self.decided!r}, {len(self.behind)} x {self.behind_reason})"
