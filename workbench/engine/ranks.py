"""Tensor parallelism across processes, rank 0's side: it schedules and sends every step to ranks
1.. (`worker.py`). Every rank samples alike from the gathered logits, so no step waits for rank 0's
tokens. Step messages travel on a gloo group of their own, which never times out."""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from ..core import Batch, ChunkedReq, Req, SamplingParams
from ..distributed import TPGroup, init_tp
from ..profiling import session_running
from .placement import rank_device

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..kvcache.table import TableManager, TableWrite

# NOTE: NVLink multicast must stay off in every process (NCCL's NVLS, symmetric memory, NVSHMEM)
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
WORKER = "workbench.engine.worker"
# messages besides steps: compare request tables; report device times; report profiler events
INTEGRITY = "integrity"
DEVICE_MS = "device_ms"
EVENTS = "events"
MAX_TIMERS = 1 << 16  # steps whose device time a rank keeps until rank 0 asks
COLLECTIVE_TIMEOUT = timedelta(minutes=10)  # a first forward may compile kernels for minutes
IDLE_TIMEOUT = timedelta(days=365)  # a worker waits for the next step as long as the user


class StepMessage(NamedTuple):
    """One launched step, as rank 0 sends it to the other ranks."""

    journal: list[TableWrite]  # rank 0's request-table writes since the last step
    prompt_ids: np.ndarray | None
    phase: str
    num_decode: int
    ledgers: np.ndarray  # int64 [requests, 7]: `ledger_of` each request
    # NOTE: sent once per request: pickling every request's sampling each step costs too much
    sampling: dict[int, SamplingParams]  # uid -> sampling, of requests new to the ranks
    gone: list[int]  # uids the ranks may forget: their requests ended
    profile: bool = False


def ledger_of(req: Req) -> tuple[int, ...]:
    """What a rank needs of a request to run its step (its tokens are in the table)."""
    chunked = isinstance(req, ChunkedReq)
    return (
        req.uid,
        req.table_idx,
        req.cached_len,
        req.device_len,
        req.prompt_len,
        req.max_device_len,
        chunked,
    )


class Ranks:
    """Rank 0's side of a tensor-parallel engine: the other ranks, and what it sends them."""

    def __init__(self, size: int, control, procs: list[subprocess.Popen], scratch: str) -> None:
        self.size, self._control, self._procs, self._scratch = size, control, procs, scratch
        self.failure: str | None = None  # why the engine cannot run any more
        self._closed = False
        self._sent: dict[int, Req] = {}
        atexit.register(self.close)  # a script that ends without close() stops its ranks too

    @property
    def processes(self) -> list[subprocess.Popen]:
        return list(self._procs)

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    @property
    def requests_known(self) -> int:
        return len(self._sent)

    def launch(self, batch: Batch, table: TableManager, prompt_ids: np.ndarray | None) -> None:
        self.check()
        journal, table.journal = table.journal, []
        gone = [uid for uid, req in self._sent.items() if req.released]
        for uid in gone:
            del self._sent[uid]
        new = {}
        for req in batch.reqs:
            if self._sent.get(req.uid) is not req:  # new, or a uid used again after a reset
                self._sent[req.uid] = req
                new[req.uid] = req.sampling
        ledgers = np.array([ledger_of(r) for r in batch.reqs], dtype=np.int64).reshape(-1, 7)
        profile = session_running()
        message = StepMessage(
            journal, prompt_ids, batch.phase, batch.num_decode, ledgers, new, gone, profile
        )
        try:
            dist.broadcast_object_list([message], src=0, group=self._control)
        except Exception:
            self.check(wait_s=2.0)
            raise

    def same_tables(self, table: TableManager) -> list[int]:
        """The ranks whose request table (page table and token pool) differs from rank 0's."""
        self.check()
        journal, table.journal = table.journal, []
        dist.broadcast_object_list([(INTEGRITY, journal)], src=0, group=self._control)
        digests: list[str | None] = [None] * self.size
        dist.all_gather_object(digests, table.digest(), group=self._control)
        return [r for r, d in enumerate(digests) if d != digests[0]]

    def device_ms(self) -> dict[int, list[float]]:
        reports = self._ask(DEVICE_MS)
        return {k: [r.get(k, math.nan) for r in reports] for k in sorted(set().union(*reports))}

    def events(self) -> dict[int, list[list[tuple]]]:
        reports = self._ask(EVENTS)
        return {k: [r.get(k, []) for r in reports] for k in sorted(set().union(*reports))}

    def _ask(self, what: str) -> list[dict]:
        self.check()
        dist.broadcast_object_list([(what, None)], src=0, group=self._control)
        reports: list[dict | None] = [None] * self.size
        dist.all_gather_object(reports, {}, group=self._control)
        return reports[1:]

    def wait(self, done: torch.cuda.Event) -> None:
        """Until `done`, polled: a dead rank leaves the collectives waiting; this raises."""
        polls = 0
        while not done.query():
            polls += 1
            if polls % 256 == 0:
                self.check()
            time.sleep(5e-5)

    def check(self, wait_s: float = 0.0) -> None:
        """Raise if a worker has died (waiting up to `wait_s` for one that is dying)."""
        if self.failure is None:
            for rank, proc in enumerate(self._procs, start=1):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(wait_s)
                if proc.returncode is not None:
                    self.failure = self._why(rank, proc)
                    break
        if self.failure is not None:
            raise RuntimeError(self.failure)

    def _why(self, rank: int, proc: subprocess.Popen) -> str:
        said = ""
        with contextlib.suppress(OSError):
            said = Path(self._scratch, f"rank{rank}.err").read_text().strip()
        return (
            f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {proc.returncode}; "
            "the engine cannot run without it: close() it and build a new one"
            + (f"\nrank {rank} said:\n{said}" if said else "")
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self.failure is None:
            with contextlib.suppress(Exception):
                dist.broadcast_object_list([None], src=0, group=self._control)
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        shutil.rmtree(self._scratch, ignore_errors=True)


def torchrun_rank(config: EngineConfig) -> int | None:
    """This process's rank under a torchrun of `config.tp_size` processes (None: not under one)."""
    if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) == config.tp_size:
        return int(os.environ["RANK"])
    return None


def start(config: EngineConfig) -> tuple[TPGroup, Ranks]:
    """Rank 0 of a `config.tp_size` engine: join torchrun's processes, or start ranks 1.."""
    size = config.tp_size
    rank = torchrun_rank(config)
    if rank is not None:
        if rank > 0:
            raise RuntimeError(
                f"torchrun rank {rank} builds no engine of its own: it serves rank 0's steps "
                "(LLM(...) does that; for an Engine, call worker.serve_under_torchrun)"
            )
        tp, control = join(0, size, config, "env://")
        return tp, Ranks(size, control, [], tempfile.mkdtemp(prefix="workbench-tp-"))
    if dist.is_initialized():
        raise RuntimeError(
            "a tensor-parallel engine already runs in this process (torch.distributed is "
            "initialised): close() it first"
        )
    # NOTE: fresh interpreters, not multiprocessing's spawn, which re-imports the user's script
    scratch = tempfile.mkdtemp(prefix="workbench-tp-")
    with open(Path(scratch, "config.pickle"), "wb") as f:
        pickle.dump(config, f)
    env = {**os.environ, **MULTICAST_OFF, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    os.environ.update(MULTICAST_OFF)  # rank 0's NCCL too
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", WORKER, str(rank), str(size), init_method, scratch], env=env
        )
        for rank in range(1, size)
    ]
    try:
        tp, control = join(0, size, config, init_method)
    except BaseException:
        for proc in procs:
            proc.kill()
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return tp, Ranks(size, control, procs, scratch)


def join(rank: int, size: int, config: EngineConfig, init_method: str):
    os.environ.update(MULTICAST_OFF)
    device = rank_device(config, rank)
    tp = init_tp(rank, size, config.tp_collectives, init_method, COLLECTIVE_TIMEOUT, device)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return tp, control


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
