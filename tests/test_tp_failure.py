"""Tensor parallelism that goes wrong (CPU, gloo): a tp_size or tp_backend that cannot run is
refused before any process starts; where each rank runs; a rank that dies gives rank 0 a clear
error within seconds, not a hang, and closing the engine still works. Apart from test_tp.py: a
process runs one tensor-parallel engine at a time."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from workbench import LLM
from workbench.engine.placement import num_devices, rank_device, ranks_on

from .conftest import greedy, run
from .test_tp import MODEL, PROMPTS


def test_a_tp_size_that_does_not_divide_the_heads_is_refused_first():
    with pytest.raises(ValueError, match=r"tp_size=3 .*allowed tp_size values: \[1, 2\]"):
        LLM(MODEL, device="cpu", tp_size=3)
    assert not dist.is_initialized()  # nothing was started


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(tp_backend="mpi"), r"tp_backend must be one of \('nccl', 'gloo'\), got 'mpi'"),
        (dict(tp_backend="nccl"), r"tp_backend='nccl' needs a CUDA.*on the cpu: 'gloo'"),
    ],
)
def test_a_tp_backend_that_cannot_run_is_refused_first(options, message):
    with pytest.raises(ValueError, match=message):
        LLM(MODEL, device="cpu", tp_size=2, **options)
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    "device, backend, gpus, tp_size, want",
    [
        ("cuda", "nccl", 1, 1, ["cuda:0"]),  # one rank on "cuda" is on cuda:0, alone
        ("cuda", "nccl", 2, 2, ["cuda:0", "cuda:1"]),
        ("cuda:1", "nccl", 4, 2, ["cuda:1", "cuda:2"]),
        ("cuda", "gloo", 1, 3, ["cuda:0", "cuda:0", "cuda:0"]),  # they share the one GPU
        ("cuda:1", "gloo", 3, 3, ["cuda:1", "cuda:2", "cuda:1"]),  # round the GPUs from cuda:1
        ("cpu", "gloo", 0, 2, ["cpu", "cpu"]),
    ],
)
def test_where_each_rank_runs_and_what_it_shares(monkeypatch, device, backend, gpus, tp_size, want):
    """Placement only (this machine has no GPU, so the GPU count is given): each rank's
    device, the distinct devices (the roofline's), and how many ranks share a rank's memory."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    config = SimpleNamespace(
        torch_device=torch.device(device), tp_collectives=backend, tp_size=tp_size
    )
    assert [str(rank_device(config, r)) for r in range(tp_size)] == want
    assert num_devices(config) == len(set(want))
    assert [ranks_on(config, r) for r in range(tp_size)] == [want.count(d) for d in want]


def test_a_rank_that_dies_mid_run_is_named_within_seconds():
    llm = LLM(
        MODEL, device="cpu", tp_size=2, max_running_reqs=8, max_extend_tokens=4, record="light"
    )
    try:
        run(llm, PROMPTS[:2], greedy(4))
        (worker,) = llm.engine.ranks.processes
        seen, killed = [], []

        def kill_after_two_steps(record) -> None:
            seen.append(record.step)
            if len(seen) == 2:
                worker.kill()
                worker.wait()
                killed.append(time.perf_counter())

        with pytest.raises(RuntimeError, match=r"tensor-parallel rank 1 \(pid \d+\) exited"):
            llm.generate(PROMPTS, greedy(10), on_step=kill_after_two_steps)
        # noticed, not waited on for ever (the margin is for a busy machine, not a speed claim)
        assert killed and time.perf_counter() - killed[0] < 60
        with pytest.raises(RuntimeError, match="rank 1"):  # and again, at once
            llm.generate(PROMPTS[:1], greedy(2))
        assert len(llm.history.steps) > 0  # the history stays readable
    finally:
        llm.close()
    assert not dist.is_initialized()


@pytest.mark.slow  # kills a process tree and waits it out: ~30 s on the CPU
def test_ranks_do_not_outlive_a_killed_rank_0(tmp_path):
    """A notebook kernel killed hard (SIGKILL: no atexit, no close) takes its ranks with it."""
    script = tmp_path / "rank0.py"
    script.write_text(
        "import sys, time\n"
        "from workbench import LLM\n"
        f"llm = LLM({MODEL!r}, device='cpu', tp_size=2, max_running_reqs=4)\n"
        "print(llm.engine.ranks.pids[0], flush=True)\n"
        "time.sleep(600)\n"
    )
    rank0 = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(rank0.stdout.readline())
        assert _alive(worker)
    finally:
        rank0.kill()
        rank0.wait()
    deadline = time.perf_counter() + 10
    while _alive(worker) and time.perf_counter() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.slow  # ~17 s; a rank dying mid-run stays in make test
def test_an_engine_that_fails_to_build_stops_its_ranks():
    """A failure after the ranks started (here: no room for one KV page) stops them, so the
    next tensor-parallel engine of the process can start."""
    with pytest.raises(ValueError, match="kv_memory_gb=1e-09 holds no page of the KV cache"):
        LLM(MODEL, device="cpu", tp_size=2, kv_memory_gb=1e-9)
    assert not dist.is_initialized()
    with LLM(MODEL, device="cpu", tp_size=2, max_running_reqs=4) as llm:
        outputs, _ = run(llm, PROMPTS[:2], greedy(3))
    assert all(len(o["token_ids"]) == 3 for o in outputs)
