"""A saved run's requests, to run again: each of its recorded lengths and arrival time."""

from __future__ import annotations

import random

from ..core import SamplingParams


def replay_requests(run, seed: int = 0, vocab: int = 10000) -> list[tuple]:
    """``(prompt ids, sampling, arrival seconds)`` per request of `run` (a history); prompts are
    seeded random ids (a run keeps no tokens), so prefixes it shared are not shared here."""
    rng = random.Random(seed)
    requests = []
    for r in run.requests.itertuples():
        ids = [rng.randrange(vocab) for _ in range(int(r.prompt_tokens))]
        outputs = max(int(r.completion_tokens), 1)
        requests.append((ids, SamplingParams(max_tokens=outputs, ignore_eos=True), r.arrival_s))
    return requests
