"""The prefix-cache interface: match a prompt against cached KV, lock what a request uses,
take ownership of KV when a request is done with it, and give space back by eviction."""

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
        """Offer the KV of `token_ids` (a whole number of pages) to the cache.

        Returns the length of the leading part the cache did *not* take because it already holds
        KV for those tokens (the naive cache takes nothing, so it returns ``len(token_ids)``).
        The caller owns ``slots[handle.cached_len : returned]`` and frees them when nothing else
        points at them.
        """

    @abstractmethod
    def evict(self, num_tokens: int) -> np.ndarray:
        """Drop at least `num_tokens` of unlocked KV (fewer if not that many are evictable);
        returns the freed slots, for the caller to put back on the free list."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Tokens held (locked or not)."""

    @property
    @abstractmethod
    def evictable_size(self) -> int:
        """Tokens held and not locked by any request."""

    @abstractmethod
    def slots(self) -> np.ndarray:
        """Every slot the cache holds (for integrity checks)."""
