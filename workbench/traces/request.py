"""One request of a trace: when it arrives, its lengths, and the prefix blocks it is made of."""

from __future__ import annotations

from typing import NamedTuple

FILE_BLOCK_SIZE = 512  # tokens a hash id stands for in a trace file (Mooncake's blocks)


class TraceRequest(NamedTuple):
    """`hash_ids`: the prompt's blocks in order (empty: a prompt of its own); equal ids are equal
    tokens, so requests whose lists begin alike share that prefix. The last block may be partial."""

    arrival_s: float  # seconds from the trace's start
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()


def block_count(prompt_len: int, block_size: int) -> int:
    """Blocks of `block_size` tokens a prompt spans, the last one partial."""
    return -(-prompt_len // block_size)
