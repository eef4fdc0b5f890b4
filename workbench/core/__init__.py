"""The ledger: sampling, a request's progress, one forward's batch and its admissions."""

from .admission import (
    DECODE_FIRST,
    KV_FULL,
    KV_FULL_AFTER_LOCK,
    NO_SLOT,
    NO_TOKEN_BUDGET,
    QUEUED_BEHIND,
    REASONS,
    WAIT_FOR_PREFIX,
    Admission,
    Admissions,
)
from .batch import Batch, Phase
from .prompts import encode_prompt
from .request import (
    ChunkedReq,
    PendingReq,
    Req,
    ReqView,
    ceil_page,
    check_request,
    floor_page,
    kv_tokens_needed,
)
from .sampling import FLOAT32_MAX, MIN_TEMPERATURE, SamplingParams, sampling_batch

__all__ = [
    "encode_prompt",
    "DECODE_FIRST",
    "FLOAT32_MAX",
    "KV_FULL",
    "KV_FULL_AFTER_LOCK",
    "MIN_TEMPERATURE",
    "NO_SLOT",
    "NO_TOKEN_BUDGET",
    "QUEUED_BEHIND",
    "REASONS",
    "WAIT_FOR_PREFIX",
    "Admission",
    "Admissions",
    "Batch",
    "ChunkedReq",
    "PendingReq",
    "Phase",
    "Req",
    "ReqView",
    "SamplingParams",
    "ceil_page",
    "check_request",
    "floor_page",
    "kv_tokens_needed",
    "sampling_batch",
]
