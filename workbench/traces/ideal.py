"""Prefix reuse: how much of a trace's prompts a prefix cache could serve (its ideal: an
unbounded cache, the requests one after another in trace order), and how much a run's did."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .request import TraceRequest, block_count


class Reuse(NamedTuple):
    """Prompt tokens and blocks, and how many of them were found in the cache. A block counts
    when all its tokens were (its whole prefix, then, too)."""

    requests: int
    prompt_tokens: int
    hit_tokens: int
    prompt_blocks: int
    hit_blocks: int

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0


def ideal_reuse(requests: Sequence[TraceRequest], block_size: int) -> Reuse:
    """The share of prompt tokens and blocks whose whole prefix up to them an earlier request
    had: what an unbounded prefix cache would hit with the requests run one at a time."""
    # the tree of block ids seen: id -> [the most of its tokens a request had, children]
    root: dict[int, list] = {}
    hit_tokens = hit_blocks = blocks = 0
    for r in requests:
        blocks += block_count(r.prompt_len, block_size)
        node, matching = root, True
        for k, h in enumerate(r.hash_ids):
            tokens = min(block_size, r.prompt_len - k * block_size)
            child = node.get(h)
            if matching and child is not None:
                seen = min(child[0], tokens)
                hit_tokens += seen
                hit_blocks += seen == tokens
                matching = seen == tokens  # a partial block ends the shared prefix
            else:
                matching = False
            if child is None:
                child = node[h] = [0, {}]
            child[0] = max(child[0], tokens)
            node = child[1]
    prompt_tokens = sum(r.prompt_len for r in requests)
    return Reuse(len(requests), prompt_tokens, hit_tokens, blocks, hit_blocks)


def run_reuse(prompt_lens: Sequence[int], cached_lens: Sequence[int], block_size: int) -> Reuse:
    """A run's reuse from each request's cached tokens at admission (whole blocks among them)."""
    blocks = sum(block_count(int(n), block_size) for n in prompt_lens)
    hit_blocks = sum(int(c) // block_size for c in cached_lens)
    return Reuse(len(prompt_lens), int(sum(prompt_lens)), int(sum(cached_lens)), blocks, hit_blocks)
