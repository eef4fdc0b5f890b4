"""The running set: requests that have a next token to compute."""

from __future__ import annotations

from collections.abc import Iterable

from ..core import Req, kv_tokens_needed


class DecodeManager:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        # NOTE: a dict as an ordered set: batches keep the order requests joined in.
        self.running: dict[Req, None] = {}

    def filter_reqs(self, reqs: Iterable[Req]) -> None:
        """Add a finished batch's requests; drop every request that can no longer decode."""
        for req in reqs:
            self.running[req] = None
        self.running = {req: None for req in self.running if req.can_decode}

    @property
    def reserved_size(self) -> int:
        """KV tokens the running requests may still allocate (their whole remaining future)."""
        ps = self.page_size
        return sum(kv_tokens_needed(r.max_device_len, r.cached_len, ps) for r in self.running)

    def __len__(self) -> int:
        return len(self.running)
