"""Benchmark workloads: random token-id prompts with uniform lengths, reproducible by seed, or a
trace's requests (`dataset.py`)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]
    arrivals: list[float] | None = None  # a trace's, in seconds; None: as --request-rate says

    @property
    def prompt_lens(self) -> list[int]:
        return [len(p) for p in self.prompts]


def random_workload(
    num_requests: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    seed: int = 0,
    vocab: int = 10000,
) -> Workload:
    """Prompts of random token ids below `vocab`; lengths uniform in the inclusive ranges."""
    rng = random.Random(seed)
    prompts, outputs = [], []
    for _ in range(num_requests):
        n = rng.randint(*input_len)
        prompts.append([rng.randrange(vocab) for _ in range(n)])
        outputs.append(rng.randint(*output_len))
    return Workload(prompts, outputs)
