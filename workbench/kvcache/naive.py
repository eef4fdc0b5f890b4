"""The naive prefix cache: never hits, keeps nothing."""

from __future__ import annotations

import numpy as np

from .base import CacheHandle, MatchResult, PrefixCache

_EMPTY = np.zeros(0, dtype=np.int32)


class NaiveCache(PrefixCache):
    shares = False

    def match(self, token_ids: list[int]) -> MatchResult:
        return MatchResult(CacheHandle(), _EMPTY)

    def lock(self, handle: CacheHandle) -> None:
        pass

    def unlock(self, handle: CacheHandle) -> None:
        pass

    def insert(self, token_ids: list[int], slots: np.ndarray) -> int:
        return len(token_ids)

    def evict(self, num_tokens: int) -> np.ndarray:
        return _EMPTY

    @property
    def size(self) -> int:
        return 0

    def slots(self) -> np.ndarray:
        return _EMPTY
