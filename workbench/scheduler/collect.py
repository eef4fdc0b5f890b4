"""The host's hand of the ledger: a batch's sampled tokens reach their requests."""

from __future__ import annotations

import numpy as np

from ..core import Batch, Req


def append_tokens(
    batch: Batch, raw: list[int], eos_ids: frozenset[int]
) -> tuple[list[int | None], list[tuple[Req, str]]]:
    """Each sampled request's token appended on the host; those that end with it are
    returned with their finish reason, which the caller sets as it ends them (so a failure in
    between leaves no request with a reason that has not ended). A request that finished in
    the batch before (overlap) is past its end here: its token is dropped (None).

    Only the requests that may end here are looked at one by one: those whose token is an EOS
    token, or is their last (known from the ledger: a request launched with `device_len` holds
    ``device_len + 1`` tokens once this one is appended)."""
    reqs = batch.sampled_reqs
    tokens: list[int | None] = raw
    past_end = [i for i, r in enumerate(reqs) if r.finish_reason is not None]
    # NOTE: appended in the loop (sampled requests are never chunks): a method call per request
    # cost a decode batch of 256 about 50 us of host time a step on the H200 machine
    if past_end:
        tokens = list(raw)
        for i in past_end:
            tokens[i] = None
        for req, token in zip(reqs, tokens):
            if token is not None:
                req.token_ids.append(token)
    else:
        for req, token in zip(reqs, raw):
            req.token_ids.append(token)
    last = batch.ledger[2] + 1 >= batch.max_lens
    if batch.phase != "decode":
        last = last[batch.sampled_mask()]
    may_end = set(np.flatnonzero(last).tolist())
    may_end.update(i for i, token in enumerate(raw) if token in eos_ids)
    ends = []
    for i in sorted(may_end):
        req, token = reqs[i], tokens[i]
        reason = None if token is None else req.end_reason(token, eos_ids)
        if reason is not None:
            ends.append((req, reason))
    return tokens, ends
