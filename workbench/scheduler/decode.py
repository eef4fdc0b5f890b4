"""The running set: requests that have a next token to compute."""

from __future__ import annotations

import numpy as np

from ..core import Batch, Req, kv_tokens_needed


class DecodeManager:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        # NOTE: a dict as an ordered set: batches keep the order requests joined in.
        self.running: dict[Req, None] = {}

    def filter_reqs(self, batch: Batch) -> None:
        """After `batch` launched: finished prompts join the running set, and requests whose
        last token is in flight leave it."""
        running, reqs = self.running, batch.reqs
        for i in np.flatnonzero(batch.ledger[2] + 1 >= batch.max_lens).tolist():
            running.pop(reqs[i], None)
        for req in batch.prefill_reqs:
            if req.can_decode:
                running[req] = None

    @property
    def reserved_size(self) -> int:
        """KV tokens the running requests may still allocate."""
        ps = self.page_size
        return sum(kv_tokens_needed(r.max_device_len, r.cached_len, ps) for r in self.running)

    def __len__(self) -> int:
        return len(self.running)
