"""Prefill admission: token budget, a free slot, and the request's whole future in KV.

The queue is FIFO and stops at the first request that does not fit. With a sharing prefix cache,
a request sharing `share_threshold` uncached tokens with one already in the batch waits instead.
A request that asks for its prompt's log probabilities takes nothing from the prefix cache (each
position's logits are computed), and a step computes at most `PROMPT_LOGPROB_ROWS` such
positions: past them, such a request waits as one past the token budget does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core import (
    KV_FULL,
    KV_FULL_AFTER_LOCK,
    NO_SLOT,
    NO_TOKEN_BUDGET,
    WAIT_FOR_PREFIX,
    Admission,
    Admissions,
    ChunkedReq,
    PendingReq,
    Req,
    floor_page,
    kv_tokens_needed,
)
from ..kvcache.base import CacheHandle
from ..kvcache.table import TableManager
from .cache import CacheManager

# prompt positions a step computes logits for beyond the sampled ones (their log probabilities):
# with a vocabulary of 152k, 2 bytes a logit, 0.6 GB
PROMPT_LOGPROB_ROWS = 2048


@dataclass
class PrefillAdder:
    token_budget: int
    reserved_size: int  # KV tokens the running requests will still allocate
    cache: CacheManager
    table: TableManager
    share_threshold: int = 0  # 0: never wait for a prefix being computed in this batch
    batch_prompts: dict[tuple, list[list[int]]] = field(default_factory=dict)  # by `_key_len`
    on_match: Callable[[int, int, int], None] | None = None  # (uid, prompt_len, cached_len)
    slots_left: int | None = None  # None: the table's free rows
    prompt_logprob_rows: int | None = None  # left in this step; None: PROMPT_LOGPROB_ROWS

    def __post_init__(self) -> None:
        if self.slots_left is None:
            self.slots_left = self.table.available_size
        if self.prompt_logprob_rows is None:
            self.prompt_logprob_rows = PROMPT_LOGPROB_ROWS

    def try_add_one(self, pending: PendingReq) -> Req | str:
        """The admitted request, or the name of the check that refused it."""
        if self.token_budget <= 0:
            return NO_TOKEN_BUDGET
        whole_prompt = pending.sampling.prompt_logprobs is not None
        if whole_prompt and self.prompt_logprob_rows <= 0:
            return NO_TOKEN_BUDGET
        if pending.chunked is not None:
            chunked = pending.chunked
            return self._add(pending, chunked.cache_handle, chunked.table_idx, chunked.cached_len)
        if self.slots_left <= 0:
            return NO_SLOT
        # (a prompt of one token matches nothing)
        match = self.cache.match(pending.token_ids[:1] if whole_prompt else pending.token_ids)
        cached_len = match.handle.cached_len
        if self.on_match is not None:
            self.on_match(pending.uid, pending.prompt_len, cached_len)
        if (
            self.share_threshold
            and self._shared_in_batch(pending) - cached_len >= self.share_threshold
        ):
            return WAIT_FOR_PREFIX
        need = kv_tokens_needed(pending.total_len, cached_len, self.cache.page_size)
        if need + self.reserved_size > self.cache.available_size:
            return KV_FULL
        self.cache.lock(match.handle)
        if need + self.reserved_size > self.cache.available_size:
            self.cache.unlock(match.handle)
            return KV_FULL_AFTER_LOCK
        row = self.table.allocate()
        self.slots_left -= 1
        if cached_len > 0:
            self.table.write_row(row, 0, match.slots)
        req = self._add(pending, match.handle, row, cached_len)
        req.cached_tokens = cached_len
        return req

    @property
    def _key_len(self) -> int:
        # NOTE: a prefix worth waiting for is >= `share_threshold` tokens, so prompts are
        # grouped by their first tokens and only those compared.
        return min(self.share_threshold, 16)

    def _shared_in_batch(self, pending: PendingReq) -> int:
        others = self.batch_prompts.get(tuple(pending.token_ids[: self._key_len]), ())
        if not others:  # (most prompts: none to compare, no array to make)
            return 0
        ids = np.asarray(pending.token_ids[:-1], dtype=np.int32)
        best = 0
        for other in map(np.asarray, others):
            n = min(len(ids), len(other))
            diff = np.flatnonzero(ids[:n] != other[:n])
            best = max(best, int(diff[0]) if len(diff) else n)
        return floor_page(best, self.cache.page_size)

    def _add(self, pending: PendingReq, handle: CacheHandle, row: int, cached_len: int) -> Req:
        if self.share_threshold and pending.prompt_len >= self._key_len:
            key = tuple(pending.token_ids[: self._key_len])
            self.batch_prompts.setdefault(key, []).append(pending.token_ids)
        left = pending.prompt_len - cached_len
        chunk = min(self.token_budget, left)
        whole_prompt = pending.sampling.prompt_logprobs is not None
        if whole_prompt:
            chunk = min(chunk, self.prompt_logprob_rows)
            self.prompt_logprob_rows -= chunk
        self.token_budget -= chunk
        self.reserved_size += kv_tokens_needed(pending.total_len, cached_len, self.cache.page_size)
        cls = ChunkedReq if chunk < left else Req
        req = cls(
            uid=pending.uid,
            token_ids=pending.token_ids[: cached_len + chunk],
            prompt_len=pending.prompt_len,
            table_idx=row,
            cached_len=cached_len,
            sampling=pending.sampling,
            cache_handle=handle,
        )
        if pending.chunked is not None:
            req.cached_tokens = pending.chunked.cached_tokens
            req.alloc_len = pending.chunked.alloc_len
        if whole_prompt:
            req.prompt_ids = pending.token_ids
            if pending.chunked is not None:  # one list over its chunks
                req.prompt_logprobs = pending.chunked.prompt_logprobs
        return req


@dataclass
class PrefillManager:
    """The waiting queue, and the prefill batches taken from its head."""

    queue: list[PendingReq] = field(default_factory=list)

    def add(self, pending: PendingReq) -> None:
        self.queue.append(pending)

    def schedule(self, adder: PrefillAdder) -> tuple[list[Req], Admissions]:
        """Admit from the head of the queue until a request does not fit."""
        decisions = Admissions()
        admitted: dict[PendingReq, Req] = {}
        for i, pending in enumerate(self.queue):
            cached_before = pending.chunked.cached_len if pending.chunked else 0
            result = adder.try_add_one(pending)
            if isinstance(result, str):
                decisions.decided.append(Admission(pending.uid, False, result, 0, cached_before))
                if result != WAIT_FOR_PREFIX:
                    decisions.behind = self.queue[i + 1 :]
                    break
                continue
            admitted[pending] = result
            decisions.decided.append(
                Admission(pending.uid, True, None, result.extend_len, result.cached_len)
            )
        if admitted:
            # NOTE: unfinished chunks go back to the head of the queue, keeping their resources.
            chunked = []
            for pending, req in admitted.items():
                if isinstance(req, ChunkedReq):
                    pending.chunked = req
                    chunked.append(pending)
            self.queue = chunked + [p for p in self.queue if p not in admitted]
        return list(admitted.values()), decisions
