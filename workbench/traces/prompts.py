"""A trace's prompts as token ids. Equal block ids become equal blocks of random tokens and
distinct ids distinct ones (seeded), so a prefix cache sees the sharing the trace recorded; a
request without block ids gets random tokens of its own."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .request import TraceRequest


def trace_prompts(
    requests: Sequence[TraceRequest], block_size: int, vocab_size: int, seed: int
) -> list[list[int]]:
    """One prompt per request: its blocks of `block_size` tokens in order, cut to its length."""
    last_use = {h: i for i, r in enumerate(requests) for h in r.hash_ids}
    blocks: dict[int, np.ndarray] = {}  # NOTE: each kept only until its last request (memory)
    prompts = []
    for i, r in enumerate(requests):
        parts = []
        for h in r.hash_ids:
            if h not in blocks:
                blocks[h] = _tokens((seed, 0, h), block_size, vocab_size)
            parts.append(blocks[h])
        own = r.prompt_len - len(r.hash_ids) * block_size
        if own > 0:
            parts.append(_tokens((seed, 1, i), own, vocab_size))
        prompts.append(np.concatenate(parts)[: r.prompt_len].tolist())
        for h in r.hash_ids:
            if last_use[h] == i:
                blocks.pop(h, None)
    return prompts


def _tokens(key: tuple[int, int, int], count: int, vocab_size: int) -> np.ndarray:
    return np.random.default_rng(key).integers(0, vocab_size, count, dtype=np.int64)
