"""A tensor-parallel rank above 0: it builds its share of the engine and runs every step rank 0
sends (`ranks.py`). Started as ``python -m workbench.engine.worker RANK SIZE INIT_METHOD SCRATCH``
(what it raised goes to SCRATCH/rank<RANK>.err, where rank 0 reads it), or by torchrun."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from ..core import Batch, ChunkedReq, Req, SamplingParams
from ..distributed import TPGroup, close_tp
from .engine import Engine, Launch
from .rank_profiler import RankProfiler
from .ranks import DEVICE_MS, EVENTS, INTEGRITY, MAX_TIMERS, StepMessage, join, torchrun_rank

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..device import DeviceTimer


def _worker(rank: int, size: int, init_method: str, scratch: str) -> None:
    _die_with_parent()
    try:
        with open(Path(scratch, "config.pickle"), "rb") as f:
            config = pickle.load(f)
        tp, control = join(rank, size, config, init_method)
        serve(config, tp, control)
    except BaseException:
        text = traceback.format_exc()
        with contextlib.suppress(OSError):
            Path(scratch, f"rank{rank}.err").write_text(text)
        sys.stderr.write(text)
        os._exit(1)
    os._exit(0)


def serve(config: EngineConfig, tp: TPGroup, control) -> None:
    """Rank > 0: build this rank's engine, then run each step rank 0 sends until it closes."""
    engine = Engine(config, tp=tp)
    timers: dict[int, DeviceTimer] = {}  # launch -> this rank's timer, until rank 0 asks
    sampling: dict[int, SamplingParams] = {}
    profiler = RankProfiler(engine.device)
    try:
        while True:
            box = [None]
            try:
                dist.broadcast_object_list(box, src=0, group=control)
            except Exception:
                break  # rank 0's process is gone without closing: nothing left to serve
            message = box[0]
            if message is None:
                break
            if isinstance(message, StepMessage):
                with profiler.step(engine.launches, message.profile):
                    step = run_step(engine, message, sampling)
                timers[step.index] = step.timer
                if len(timers) > MAX_TIMERS:  # rank 0 has not asked for a long while
                    del timers[next(iter(timers))]
            elif message[0] == INTEGRITY:
                engine.table.replay(message[1])
                digests = [None] * tp.size
                dist.all_gather_object(digests, engine.table.digest(), group=control)
            elif message[0] == DEVICE_MS:
                report = {k: t.elapsed_ms() for k, t in timers.items()}
                timers.clear()
                dist.all_gather_object([None] * tp.size, report, group=control)
            elif message[0] == EVENTS:
                dist.all_gather_object([None] * tp.size, profiler.events(), group=control)
    finally:
        profiler.close()
        engine.close()
        close_tp(tp)


def run_step(engine: Engine, message: StepMessage, sampling: dict[int, SamplingParams]) -> Launch:
    """Replay rank 0's table writes, then run the step it launched (`sampling` kept up to date)."""
    for uid in message.gone:
        sampling.pop(uid, None)
    sampling.update(message.sampling)
    engine.table.replay(message.journal)
    reqs = [mirror(row, sampling[row[0]]) for row in message.ledgers.tolist()]
    batch = Batch(reqs, message.phase, message.num_decode)
    batch.snapshot()
    launch = engine.prepare(batch, message.prompt_ids)
    engine.sample(launch, engine.forward(launch))
    return launch


def mirror(ledger: list[int], sampling: SamplingParams) -> Req:
    """The request rank 0 sent as `ledger` (`ranks.ledger_of`)."""
    uid, table_idx, cached_len, device_len, prompt_len, max_len, chunked = ledger
    cls = ChunkedReq if chunked else Req
    return cls.mirror(uid, table_idx, cached_len, device_len, prompt_len, max_len, sampling)


def serve_under_torchrun(config: EngineConfig) -> None:
    """Under torchrun, on a rank above 0: serve rank 0's steps until it closes, then exit."""
    rank = torchrun_rank(config)
    tp, control = join(rank, config.tp_size, config, "env://")
    serve(config, tp, control)
    raise SystemExit(0)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (even a notebook kernel killed hard)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(1)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
