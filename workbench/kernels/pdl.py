"""Programmatic dependent launch (PDL, Hopper and later) for the small-batch decode kernels.

A decode step at batch 8 is about 230 kernels of a few microseconds each, and every boundary
between two of them costs the next one's launch and ramp-up while the GPU drains the last one.
Launched with PDL, a kernel may start while the kernel before it on the stream is still running;
it calls `wait_for_previous` before it touches anything another kernel writes (after that, the
kernel before it has finished and its writes are visible), and that call also lets the kernel
after it start. FlashInfer's norms and activation launch this way on Hopper already; with ours
too, the decode layer's chain (norm, QKV, q/k norm and RoPE, attention, output, norm, gate-up,
down) overlaps each launch with the tail of the one before.

The rule each kernel keeps: no store, atomic or load of anything a kernel writes before the wait
(the caching allocator reuses a buffer as soon as the stream has queued its last reader, and with
PDL that reader may still be running). Weights are written by no kernel, so the small GEMM reads
its first tile of them before it waits: the weight stream, which bounds it, starts during the
previous kernel's tail.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch
import triton
import triton.language as tl

# Triton's interpreter (the CPU tests): kernels run one after another, so there is nothing to wait
# for; a kernel asked for PDL there runs its PDL path without the wait
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: a CUDA GPU of compute capability 9.0 or later,
    and a Triton with grid dependency control (3.4 and later)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    from triton.backends.nvidia.compiler import CUDAOptions

    launches = "launch_pdl" in {field.name for field in dataclasses.fields(CUDAOptions)}
    return launches and hasattr(getattr(tl.extra, "cuda", None), "gdc_wait")


def check_pdl(device: torch.device, pdl: bool) -> bool:
    """The kernel's `PDL` (whether it waits and launches with PDL) for the wrapper's `pdl`: False
    in Triton's interpreter; True where PDL is not supported is an error that says why."""
    if INTERPRETED:
        return False
    if pdl and not pdl_supported(device):
        raise ValueError(
            f"pdl=True needs a CUDA GPU of compute capability 9.0 or later and Triton 3.4 or "
            f"later, got device {device}"
        )
    return bool(pdl)


def launch_options(pdl: bool) -> dict:
    """The launch's keyword for PDL (none without it, so Triton's interpreter is not asked)."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def wait_for_previous(PDL: tl.constexpr):
    """Wait until the kernel before this one has finished (its writes visible), then let the
    kernel after this one launch; nothing without `PDL`."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
