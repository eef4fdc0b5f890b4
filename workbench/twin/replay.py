"""A saved run's requests, to run again (on a twin, or a real engine): each prompt of its
recorded length, each output of its recorded length, each arrival at its recorded time."""

from __future__ import annotations

import random

from ..core import SamplingParams


def replay_requests(run, seed: int = 0, vocab: int = 10000) -> list[tuple]:
    """``(prompt ids, sampling, arrival seconds)`` per request of `run` (a history), for
    ``wb.compare(settings, replay_requests(run), arrival="time")``. A run keeps its prompts'
    lengths, not their tokens: each prompt is random ids below `vocab` (seeded), so prompts
    that shared a prefix in the run do not share it here. Each request produces as many tokens
    as it did (EOS ignored), so a twin's request ends where the real one did."""
    rng = random.Random(seed)
    requests = []
    for r in run.requests.itertuples():
        ids = [rng.randrange(vocab) for _ in range(int(r.prompt_tokens))]
        outputs = max(int(r.completion_tokens), 1)
        requests.append((ids, SamplingParams(max_tokens=outputs, ignore_eos=True), r.arrival_s))
    return requests
