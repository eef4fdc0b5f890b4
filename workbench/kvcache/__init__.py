"""KV memory: the pool of token slots and the prefix caches over it."""

from __future__ import annotations

from .base import CacheHandle, MatchResult, PrefixCache
from .naive import NaiveCache
from .pool import KVPool

CACHES = {"naive": NaiveCache}


def create_prefix_cache(kind: str, page_size: int) -> PrefixCache:
    if kind == "radix":
        from .radix import RadixCache

        return RadixCache(page_size)
    if kind not in CACHES:
        raise ValueError(f"unknown cache {kind!r}; expected one of {sorted(CACHES) + ['radix']}")
    return CACHES[kind](page_size)


__all__ = ["CacheHandle", "KVPool", "MatchResult", "PrefixCache", "create_prefix_cache"]
