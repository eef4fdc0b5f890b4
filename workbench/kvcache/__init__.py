"""KV memory: the pool of token slots and the prefix caches over it."""

from __future__ import annotations

from ..registry import create
from .base import CacheHandle, MatchResult, PrefixCache
from .pool import KVPool

CACHES = {
    "naive": "workbench.kvcache.naive:NaiveCache",
    "radix": "workbench.kvcache.radix:RadixCache",
}


def create_prefix_cache(kind: str, page_size: int) -> PrefixCache:
    return create(CACHES, "cache", kind, page_size)


__all__ = ["CACHES", "CacheHandle", "KVPool", "MatchResult", "PrefixCache", "create_prefix_cache"]
