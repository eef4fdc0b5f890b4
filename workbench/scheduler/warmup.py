"""Warm-up: run every path a step can take once before anything is measured.

First use pages in mapped weights and loads kernels, which would otherwise land in whichever
run is measured first.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from ..core import ChunkedReq, SamplingParams
from ..engine.engine import Engine
from .record import StepRecord
from .scheduler import Scheduler

_CHUNK = 16
_MAX_STEPS = 64  # a pass not ended by then (a pool too small for it) stops there


class WarmUp(NamedTuple):
    """What an engine's warm-up ran, and what it took."""

    ms: float
    steps: int
    paths: frozenset[str]  # phases, "chunk", the sampling kind, and "graph" / "eager"


def warm_up(engine: Engine) -> WarmUp:
    """Run the warm-up passes on `engine`."""
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
        scheduler.abort_all()
        scheduler.check_integrity()
    return WarmUp((time.perf_counter() - started) * 1e3, steps, frozenset(paths))


def _paths(record: StepRecord) -> set[str]:
    batch = record.batch
    paths = {batch.phase, "graph" if record.cuda_graph else "eager"}
    paths |= {"chunk" for req in batch.reqs if isinstance(req, ChunkedReq)}
    for req in batch.sampled_reqs:
        p = req.sampling
        top = p.top_k > 0 or p.top_p < 1.0
        paths.add("greedy" if p.is_greedy else "top-k/top-p" if top else "random")
    return paths


def _passes(engine: Engine) -> list[tuple]:
    config = engine.config
    room = min(engine.max_seq_len, engine.num_pages * config.page_size) - 2 * config.page_size
    greedy = SamplingParams(max_tokens=2, ignore_eos=True)
    sampled = SamplingParams(max_tokens=2, temperature=0.8, seed=1, ignore_eos=True)
    top = SamplingParams(
        max_tokens=2, temperature=0.8, top_k=20, top_p=0.9, seed=2, ignore_eos=True
    )
    chunked = _prompt(engine, min(_CHUNK + 4, room // 2 - 3), 1)
    short = _prompt(engine, min(5, room // 2 - 3), 2)
    if len(short) < 1:
        return []
    first = config.with_(policy="prefill_first", max_extend_tokens=_CHUNK)
    mixed = config.with_(policy="mixed", max_extend_tokens=_CHUNK)
    passes = [
        (first, [(chunked, greedy), (short, sampled)]),
        (mixed, [(short, top), (chunked, greedy)]),
    ]
    graphs = engine.graphs
    largest = config.cuda_graph_max_tokens + 1
    if graphs is not None and graphs.prompt_shapes and largest + 2 <= room:
        # NOTE: a prompt step beyond the captured graphs runs eagerly, on kernels not yet loaded
        eager = SamplingParams(max_tokens=1, ignore_eos=True)
        passes.append(
            (config.with_(max_extend_tokens=largest), [(_prompt(engine, largest, 3), eager)])
        )
    return passes


def _prompt(engine: Engine, length: int, seed: int) -> list[int]:
    vocab = engine.model_config.vocab_size
    span = max(1, vocab - 100)
    return [100 % vocab + (seed * 7919 + i * 104729) % span for i in range(max(length, 0))]
