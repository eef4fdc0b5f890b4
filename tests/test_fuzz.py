"""Fuzz whole workloads (slow): random settings, arrivals, shared prefixes, aborts in every
state, tight pools that evict, and steps padded to the CUDA graphs' shapes (their path, run
eagerly), with the KV pool's integrity checked after every step and every finished greedy answer
compared with Hugging Face.

`pytest -m slow tests/test_fuzz.py` runs WORKBENCH_FUZZ workloads (default 1000; seed from
WORKBENCH_FUZZ_SEED) and prints the counts.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter

import pytest

from workbench import SamplingParams, Workbench

from .conftest import hf_greedy

_engines: dict[tuple, Workbench] = {}


def engine(page_size: int, slots: int, pool_tokens: int, padded: bool) -> Workbench:
    """Engines by what only an engine fixes; the schedule is reconfigured per workload.
    `padded`: steps padded to the CUDA graphs' shapes (their path, run eagerly on the CPU)."""
    key = (page_size, slots, pool_tokens, padded)
    if key not in _engines:
        _engines[key] = Workbench(
            "tiny-llama",
            page_size=page_size,
            max_running_reqs=slots,
            num_pages=pool_tokens // page_size,
            max_seq_len=256,
            padded_steps=padded,
            cuda_graph_max_tokens=64,
        )
    return _engines[key]


def workload(rng: random.Random, counts: Counter) -> None:
    page_size = rng.choice([1, 2, 4, 8, 16])
    slots, pool_tokens = rng.choice([1, 2, 4, 6]), rng.choice([128, 256, 1024])
    wb = engine(page_size, slots, pool_tokens, padded=rng.random() < 0.3)
    wb.reset()
    wb.reconfigure(
        policy=rng.choice(["prefill_first", "decode_first", "mixed"]),
        cache=rng.choice(["radix", "radix", "naive"]),
        max_extend_tokens=rng.choice([1, 2, 3, 5, 8, 16, 31, 64, 8192]),
        overlap=rng.random() < 0.5,
        share_threshold=rng.choice([0, 4, 32]),
        record=rng.choice(["off", "light", "light"]),
    )
    capacity = wb.scheduler.cache.total_size
    prefixes = [[rng.randrange(100, 600) for _ in range(rng.randint(1, 60))] for _ in range(2)]
    requests = {}
    for _ in range(rng.randint(1, 8)):
        prompt = rng.choice(prefixes)[: rng.randint(1, 60)] if rng.random() < 0.6 else []
        prompt = prompt + [rng.randrange(100, 600) for _ in range(rng.randint(1, 30))]
        max_tokens = rng.randint(1, 12)
        if -(-(len(prompt) + max_tokens) // page_size) * page_size > capacity:
            continue
        sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=rng.random() < 0.8)
        uid = wb.add_request(prompt, sampling, arrival_step=rng.choice([None, *range(12)]))
        requests[uid] = (prompt, sampling)
    aborts = {uid: rng.randint(0, 20) for uid in requests if rng.random() < 0.2}
    steps = 0
    while not wb.is_done:
        for uid, at in list(aborts.items()):
            if at <= steps:
                del aborts[uid]
                if uid not in wb.scheduler.finished:
                    wb.abort(uid)
                    counts["aborts"] += 1
        wb.step()
        wb.check_integrity()
        steps += 1
        assert steps < 5000, "no progress"
    counts["steps"] += steps
    for out in wb.outputs():
        prompt, sampling = requests[out["uid"]]
        want = hf_greedy("tiny-llama", [prompt], sampling.max_tokens, sampling.ignore_eos)[0]
        if out["finish_reason"] == "abort":
            assert out["token_ids"] == want[: len(out["token_ids"])]
        else:
            assert out["token_ids"] == want, (out, wb.config)
            counts["requests compared"] += 1
    counts["workloads"] += 1


@pytest.mark.slow
def test_fuzz_workloads():
    n = int(os.environ.get("WORKBENCH_FUZZ", "1000"))
    seed = int(os.environ.get("WORKBENCH_FUZZ_SEED", "0"))
    counts: Counter = Counter()
    start = time.perf_counter()
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        try:
            workload(rng, counts)
        except Exception as exc:
            raise AssertionError(f"workload {i} (seed {seed}) failed") from exc
    print(
        f"\nfuzz: {counts['workloads']} workloads clean, {counts['steps']} steps with the "
        f"integrity check after each, {counts['requests compared']} answers equal to Hugging "
        f"Face greedy, {counts['aborts']} aborts; {time.perf_counter() - start:.0f} s"
    )
    _engines.clear()


def api_sequence(rng: random.Random, counts: Counter) -> None:
    """A user's calls in a random order on one workbench: requests added now and later, single
    and multiple steps, `run_until`, aborts (of live, finished and unknown uids), reconfigure
    (refused unless idle; a new run when done) and reset (with `again` or not), the pool checked
    after each call; then the run to its end, every answer of a request of this run equal to
    Hugging Face's."""
    padded = rng.random() < 0.4
    wb = engine(rng.choice([1, 4, 16]), 4, 512, padded)
    wb.reset()
    requests: dict[int, tuple] = {}
    for _ in range(rng.randint(5, 40)):
        call = rng.choice(["add", "add", "step", "step", "steps", "until", "abort", "reconfigure"])
        call = "reset" if rng.random() < 0.08 else call
        counts[call] += 1
        if call == "add":
            prompt = [rng.randrange(100, 600) for _ in range(rng.randint(1, 40))]
            sampling = SamplingParams(max_tokens=rng.randint(1, 10), ignore_eos=True)
            step = wb.step_index + rng.randint(0, 5) if rng.random() < 0.5 else None
            requests[wb.add_request(prompt, sampling, arrival_step=step)] = (prompt, sampling)
        elif call == "step":
            wb.step()
        elif call == "steps":
            wb.step(rng.randint(2, 6))
        elif call == "until":
            wb.run_until(lambda record: record.num_tokens > 3, max_steps=5)
        elif call == "abort":
            uid = rng.choice([*requests, 10**6])
            try:
                wb.abort(uid)
            except ValueError:  # finished already, or never added
                assert uid not in requests or uid in wb.scheduler.finished
                counts["aborts refused"] += 1
        elif call == "reconfigure":
            try:
                wb.reconfigure(
                    max_extend_tokens=rng.choice([1, 3, 8, 64]),
                    policy=rng.choice(["prefill_first", "decode_first", "mixed"]),
                    overlap=rng.random() < 0.5,
                    cache=rng.choice(["radix", "naive"]),
                )
            except RuntimeError:  # requests due to arrive: not idle
                counts["reconfigures refused"] += 1
            else:  # a new run: its history, outputs and uids start over
                assert wb.step_index == 0 and not wb.outputs() and not len(wb.history.requests)
                requests = {}
        else:
            wb.reset(again=rng.random() < 0.5)
            requests = {}  # (again: the same requests under new uids)
        wb.check_integrity()
    wb.run(progress=False)
    wb.check_integrity()
    for out in wb.outputs():
        if out["uid"] in requests:
            prompt, sampling = requests[out["uid"]]
            want = hf_greedy("tiny-llama", [prompt], sampling.max_tokens, True)[0]
            assert out["token_ids"] == want[: len(out["token_ids"])]
            assert out["finish_reason"] == "abort" or len(out["token_ids"]) == len(want)
            counts["answers compared"] += 1


@pytest.mark.slow
def test_fuzz_api_sequences():
    n = int(os.environ.get("WORKBENCH_FUZZ", "1000")) // 4
    seed = int(os.environ.get("WORKBENCH_FUZZ_SEED", "0"))
    counts: Counter = Counter()
    start = time.perf_counter()
    for i in range(n):
        try:
            api_sequence(random.Random(seed * 1_000_003 + i), counts)
        except Exception as exc:
            raise AssertionError(f"sequence {i} (seed {seed}) failed") from exc
    print(f"\nfuzz: {n} API sequences clean; {dict(counts)}; {time.perf_counter() - start:.0f} s")
    _engines.clear()
