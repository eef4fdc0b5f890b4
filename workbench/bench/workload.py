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


RANDOM_VOCAB = 10000  # random prompts' token ids are below this (the same ids for every model)


def prompt_vocab(llm) -> int:
    """The token ids random prompts draw from on `llm`: below `RANDOM_VOCAB` or its vocabulary."""
    return min(RANDOM_VOCAB, llm.engine.model_config.vocab_size)


def random_workload(
    num_requests: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    seed: int = 0,
    vocab: int = RANDOM_VOCAB,
) -> Workload:
    """Prompts of random token ids below `vocab` (`prompt_vocab`); lengths uniform in the
    inclusive ranges."""
    rng = random.Random(seed)
    prompts, outputs = [], []
    for _ in range(num_requests):
        n = rng.randint(*input_len)
        prompts.append([rng.randrange(vocab) for _ in range(n)])
        outputs.append(rng.randint(*output_len))
    return Workload(prompts, outputs)
