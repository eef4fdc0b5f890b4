"""The prefix-cache interface: match, lock what a request uses, take its KV, evict."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np


class CacheHandle:
    """What a request holds on the cache: how many leading tokens matched. Subclasses add where."""

    cached_len: int = 0


class MatchResult(NamedTuple):
    handle: CacheHandle
    slots: np.ndarray  # KV slots of the matched tokens, [handle.cached_len]


class PrefixCache(ABC):
    """Token-keyed cache of KV slots. All lengths are in tokens and multiples of `page_size`."""

    shares = True  # False for a cache that never hits: nothing to insert while a request runs

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    @abstractmethod
    def match(self, token_ids: list[int]) -> MatchResult:
        """The longest cached prefix of `token_ids` (whole pages). Does not lock it."""

    @abstractmethod
    def lock(self, handle: CacheHandle) -> None:
        """Protect the matched path from eviction while a request uses it."""

    @abstractmethod
    def unlock(self, handle: CacheHandle) -> None: ...

    @abstractmethod
    def insert(self, token_ids: list[int], slots: np.ndarray) -> int:
        """Offer the KV of `token_ids` (whole pages); returns `n`, the leading tokens it did not
        take (held already; naive: all). The caller owns ``slots[handle.cached_len : n]``."""

    @abstractmethod
    def evict(self, num_tokens: int) -> np.ndarray:
        """Drop at least `num_tokens` of unlocked KV (fewer if not evictable); the freed slots."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Tokens held (locked or not)."""

    evictable_size: int = 0  # tokens held and not locked by any request (kept up to date)

    @abstractmethod
    def slots(self) -> np.ndarray:
        """Every slot the cache holds (for integrity checks)."""
