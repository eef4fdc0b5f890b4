"""Requests that arrive over time (`bench --request-rate R`): Poisson arrivals, and per-request
latencies. Policies and chunk sizes only differ when requests arrive while others run:
`--request-rate 30 --sweep policy=prefill_first,mixed`."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..core import SamplingParams
from ..history import latency
from ..llm import LLM
from ..scheduler.record import StepRecord


def poisson_arrivals(num_requests: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival times in seconds from the start; `rate` requests/s (inf: all at time 0)."""
    if not rate > 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(num_requests):
        t += rng.expovariate(rate)
        times.append(t)
    return times


@dataclass(frozen=True)
class Timing:
    """One request, in seconds from the start of serving."""

    arrival: float
    first_token: float
    finish: float
    output_tokens: int
    cached_tokens: int = 0  # prompt tokens the prefix cache held at its admission

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        return latency.tpot(self.first_token, self.finish, self.output_tokens)


def serve(
    llm: LLM,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    arrivals: Sequence[float],
    on_step: Callable[[StepRecord], None] | None = None,
    idle: list[tuple[float, float]] | None = None,
) -> list[Timing]:
    """Add each request when its arrival time has come, step until every one has finished;
    `idle` gets the spans (the clock's from, to) it waited with nothing to step for the next.

    Times are the run's clock's (a twin's is virtual). A token counts as delivered when the step
    that collected it returns (the host has it)."""
    for i, (ids, sp) in enumerate(zip(prompts, params)):
        llm.check_request(ids, sp, i)  # every request is valid before the clock starts
    sched = llm.scheduler
    order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    index_of: dict[int, int] = {}
    first: dict[int, float] = {}
    finish: dict[int, float] = {}
    count = [0] * len(prompts)
    clock = sched.clock
    clock.resume()
    start = clock.now()
    due = 0
    while len(finish) < len(prompts):
        now = clock.now() - start
        while due < len(order) and arrivals[order[due]] <= now:
            i = order[due]
            # arrived at its time, not when the step it fell due in ended
            uid = sched.add_request(list(prompts[i]), params[i], arrived=start + arrivals[i])
            index_of[uid] = i
            due += 1
        record = sched.step()
        if record is None:
            if due < len(order):
                waited = clock.now()
                clock.wait_until(start + arrivals[order[due]])  # (a twin's clock jumps there)
                if idle is not None:
                    idle.append((waited, clock.now()))
                continue
            break
        t = clock.now() - start
        sampled = record.batch.sampled_reqs if record.batch is not None else None
        uids = [r.uid for r in sampled] if sampled is not None else _sampled_uids(record)
        for uid, token in zip(uids, record.tokens):
            if token is not None:
                i = index_of[uid]
                first.setdefault(i, t)
                count[i] += 1
        for uid in record.finished:
            finish[index_of[uid]] = t
        if on_step is not None:
            on_step(record)
        llm.hooks.raise_pending()
    record = sched.flush()
    if record is not None and on_step is not None:
        on_step(record)
    sched.probe.flush()  # record="full": the session ends (its events are read when looked at)
    cached = [0] * len(prompts)
    for uid, i in index_of.items():
        req = sched.finished.pop(uid, None)
        cached[i] = req.cached_tokens if req is not None else 0
    return [
        Timing(arrivals[i], first[i], finish[i], count[i], cached[i]) for i in range(len(prompts))
    ]


def _sampled_uids(record: StepRecord) -> list[int]:
    """The requests of a completed record that got a token, in batch order."""
    return [r.uid for r in record.rows if r.kind != "chunk"]


def latency_summary(timings: list[Timing]) -> dict:
    """Percentiles (ms) of TTFT, TPOT and end-to-end latency."""

    def pct(values: list[float], name: str) -> dict:
        if not values:
            return {}
        p = np.percentile(np.asarray(values) * 1e3, [50, 90, 99])
        return {f"{name}_ms_p{q}": round(float(v), 2) for q, v in zip((50, 90, 99), p)}

    tpots = [t.tpot for t in timings if t.tpot is not None]
    return {
        **pct([t.ttft for t in timings], "ttft"),
        **pct(tpots, "tpot"),
        **pct([t.finish - t.arrival for t in timings], "e2e"),
    }
