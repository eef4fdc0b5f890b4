"""A tensor-parallel rank started by rank 0: ``python -m workbench.engine.worker RANK SIZE
INIT_METHOD SCRATCH`` (see `tp.py`). Its engine config is pickled in SCRATCH; what it raised goes
to SCRATCH/rank<RANK>.err, where rank 0 reads it."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import traceback
from pathlib import Path


def _worker(rank: int, size: int, init_method: str, scratch: str) -> None:
    """A started rank: build this rank's engine, run the steps rank 0 sends, stop when told (or
    when rank 0's process is gone)."""
    _die_with_parent()
    try:
        with open(Path(scratch, "config.pickle"), "rb") as f:
            config = pickle.load(f)
        from .tp import join, serve

        tp, control = join(rank, size, config, init_method)
        serve(config, tp, control)
    except BaseException:
        text = traceback.format_exc()
        with contextlib.suppress(OSError):
            Path(scratch, f"rank{rank}.err").write_text(text)
        sys.stderr.write(text)
        os._exit(1)
    os._exit(0)


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (a notebook kernel killed hard
    never leaves its ranks behind)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(1)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
