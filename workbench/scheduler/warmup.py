"""An engine's first steps cost more than the same steps later: its first forward touches every
weight for the first time (read from the file the weights are mapped from, on the CPU: 0.3 s
for SmolLM2 here, against a 0.1 s step), and on a GPU each kernel family loads on first use.
Whatever ran first in a comparison would carry that in its time to first token. So an engine
takes every path a run's steps can take once, on a scheduler of its own that nobody watches,
before anything is measured: a prompt in one step and in chunks, decoding, a mixed step (chunks
beside decodes), greedy and random sampling (with and without top-k / top-p, which a GPU samples
with different kernels), and on a GPU a prompt step larger than the captured CUDA graphs (the
graphs themselves ran when they were captured). Every request is freed after; the KV pool's
integrity is checked.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from ..core import ChunkedReq, SamplingParams
from ..engine.engine import Engine
from .record import StepRecord
from .scheduler import Scheduler

_CHUNK = 16  # the warm-up's token budget: prompts of a few chunks stay cheap on any model
_MAX_STEPS = 64  # a pass that has not ended by then (a pool too small for it) stops there


class WarmUp(NamedTuple):
    """What an engine's warm-up ran, and what it took."""

    ms: float
    steps: int
    # the paths its steps took: their phases ("prefill", "decode", "mixed"), "chunk" (a
    # prompt's part), the sampling ("greedy", "random", "top-k/top-p") and "graph" / "eager"
    paths: frozenset[str]


def warm_up(engine: Engine) -> WarmUp:
    """Run the warm-up passes (see the module) on `engine`."""
    started, steps, paths = time.perf_counter(), 0, set()
    for config, requests in _passes(engine):
        scheduler = Scheduler(engine, config=config)
        for ids, sampling in requests:
            scheduler.add_request(ids, sampling)
        for _ in range(_MAX_STEPS):
            record = scheduler.step() or scheduler.flush()
            if record is None:
                break
            steps += 1
            paths |= _paths(record)
        scheduler.abort_all()  # what a pass cut short held, and the prefix cache's pages
        scheduler.check_integrity()
    return WarmUp((time.perf_counter() - started) * 1e3, steps, frozenset(paths))


def _paths(record: StepRecord) -> set[str]:
    batch = record.batch  # (nobody watches: the record is not completed)
    paths = {batch.phase, "graph" if record.cuda_graph else "eager"}
    paths |= {"chunk" for req in batch.reqs if isinstance(req, ChunkedReq)}
    for req in batch.sampled_reqs:
        p = req.sampling
        top = p.top_k > 0 or p.top_p < 1.0
        paths.add("greedy" if p.is_greedy else "top-k/top-p" if top else "random")
    return paths


def _passes(engine: Engine) -> list[tuple]:
    """(scheduler config, requests) of each pass, sized to the engine's context and KV pool."""
    config = engine.config
    room = min(engine.max_seq_len, engine.num_pages * config.page_size) - 2 * config.page_size
    greedy = SamplingParams(max_tokens=2, ignore_eos=True)
    sampled = SamplingParams(max_tokens=2, temperature=0.8, seed=1, ignore_eos=True)
    top = SamplingParams(
        max_tokens=2, temperature=0.8, top_k=20, top_p=0.9, seed=2, ignore_eos=True
    )
    chunked = _prompt(engine, min(_CHUNK + 4, room // 2 - 3), 1)  # a chunk, then the rest
    short = _prompt(engine, min(5, room // 2 - 3), 2)
    if len(short) < 1:
        return []
    first = config.with_(policy="prefill_first", max_extend_tokens=_CHUNK)
    mixed = config.with_(policy="mixed", max_extend_tokens=_CHUNK)
    passes = [
        (first, [(chunked, greedy), (short, sampled)]),
        (mixed, [(short, top), (chunked, greedy)]),
    ]
    graphs = engine.prefill_graphs
    largest = config.cuda_graph_max_tokens + 1
    if graphs is not None and largest + 2 <= room:
        # a prompt step beyond the captured shapes runs eagerly, its kernels loaded on first
        # use (any budget can be set later by `reconfigure`)
        eager = SamplingParams(max_tokens=1, ignore_eos=True)
        passes.append(
            (config.with_(max_extend_tokens=largest), [(_prompt(engine, largest, 3), eager)])
        )
    return passes


def _prompt(engine: Engine, length: int, seed: int) -> list[int]:
    """`length` token ids spread over the vocabulary, away from its first (special) ids."""
    vocab = engine.model_config.vocab_size
    span = max(1, vocab - 100)
    return [100 % vocab + (seed * 7919 + i * 104729) % span for i in range(max(length, 0))]
