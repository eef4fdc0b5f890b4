"""The events hooks receive: small, frozen, CPU values only (safe to keep)."""

from __future__ import annotations

from dataclasses import dataclass

from ..core import ReqView


@dataclass(frozen=True, slots=True)
class RequestArrive:
    step: int
    uid: int
    prompt_len: int
    max_tokens: int
    source: str = "python"  # or "http"


@dataclass(frozen=True, slots=True)
class CacheMatch:
    step: int
    uid: int
    prompt_len: int
    cached_len: int


@dataclass(frozen=True, slots=True)
class Admit:
    step: int
    uid: int
    kind: str  # "prefill" (the rest of its prompt fits) or "chunk"
    cached_len: int
    extend_len: int
    table_idx: int


@dataclass(frozen=True, slots=True)
class Reject:
    step: int
    uid: int
    reason: str  # no_token_budget, no_slot, kv_full, kv_full_after_lock, ...


@dataclass(frozen=True, slots=True)
class ScheduleEnd:
    step: int
    phase: str | None  # None: nothing to run
    uids: tuple[int, ...]
    admitted: int
    rejected: int


@dataclass(frozen=True, slots=True)
class CacheInsert:
    step: int
    uid: int
    inserted_len: int  # tokens offered (whole pages)
    already_cached: int  # of which the cache held already


@dataclass(frozen=True, slots=True)
class CacheEvict:
    step: int
    requested: int
    freed: int


@dataclass(frozen=True, slots=True)
class BatchPrepared:
    step: int
    phase: str
    rows: tuple[ReqView, ...]  # ledgers as launched
    num_tokens: int
    new_pages: int


@dataclass(frozen=True, slots=True)
class ForwardBegin:
    step: int
    phase: str
    batch_size: int
    num_tokens: int
    cuda_graph: bool


@dataclass(frozen=True, slots=True)
class ForwardEnd:
    step: int
    phase: str
    ledger: tuple[ReqView, ...]  # lengths after the device-side ledger moved


@dataclass(frozen=True, slots=True)
class SampleEnd:
    step: int
    uids: tuple[int, ...]
    tokens: tuple[int, ...]
    # per sampled request, with SamplingParams(logprobs=n): (the token's log probability, the n
    # most likely tokens as (id, log probability)); None for one that did not ask, or all None
    logprobs: tuple | None = None
    # per sampled request, with SamplingParams(prompt_logprobs=n), at its first token: its whole
    # prompt's (None for the first prompt token, then entries as above); else None, or all None
    prompt_logprobs: tuple | None = None


@dataclass(frozen=True, slots=True)
class MoeRoute:
    step: int
    layers: tuple[int, ...]  # the decoder layers with an MoE block, in `counts`' order
    # per MoE layer, the tokens each expert received (a CUDA graph's padding not counted)
    counts: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class RequestFinish:
    step: int
    uid: int
    reason: str  # "stop" (EOS), "length" (max_tokens), "abort" (Scheduler.abort), "error"
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
