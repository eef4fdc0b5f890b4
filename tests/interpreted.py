"""Triton kernels run by Triton's interpreter (numpy, on the CPU), for the kernel tests.

@triton.jit functions, triton.language's own among them, become interpreted only when
TRITON_INTERPRET is set before triton is imported: so a kernel runs in a child process, and every
other Triton kernel in the test's process stays compiled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch


def run_interpreted(folder: Path, child: str, cases: dict) -> dict:
    """What `child` (Python source: reads the cases from the file `sys.argv[1]`, saves a dict of
    outputs to `sys.argv[2]`) saves for `cases`, run with the interpreter."""
    torch.save(cases, folder / "cases.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-c", child, str(folder / "cases.pt"), str(folder / "outputs.pt")]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the interpreted kernel failed:\n{done.stderr[-4000:]}"
    return torch.load(folder / "outputs.pt")
