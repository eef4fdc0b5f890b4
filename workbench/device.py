"""Device helpers: host-to-device copies that never stall the host, and a device timer.

A copy from pageable host memory makes CUDA wait for the stream to drain first, which would undo
overlap scheduling (the host would wait for the batch in flight). Everything the scheduler sends
per step goes through a pinned staging tensor instead; torch's pinned allocator keeps it alive
until the copy has run.
"""

from __future__ import annotations

import time

import numpy as np
import torch


def host_tensor(data, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """A CPU tensor of `data` (a sequence or array), in pinned memory when asked."""
    t = torch.from_numpy(np.ascontiguousarray(data, dtype=_NUMPY[dtype]))
    return t.pin_memory() if pinned else t


def to_device(data, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """`data` on `device`, copied asynchronously from pinned memory when the device is a GPU."""
    cuda = device.type == "cuda"
    return host_tensor(data, dtype, pinned=cuda).to(device, non_blocking=cuda)


def to_device_many(arrays, device: torch.device) -> list[torch.Tensor]:
    """Several int64 arrays in one copy (one pinned staging tensor, one transfer): contiguous
    slices of one device tensor. A step sends about a dozen small index arrays; each separate
    copy costs the host a pinned allocation and a launch."""
    sizes = [len(a) for a in arrays]
    # NOTE: each slice starts 16-byte aligned, for kernels that load with vector width
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum([n + (n & 1) for n in sizes], out=starts[1:])
    packed = np.zeros(int(starts[-1]), dtype=np.int64)
    for a, start, n in zip(arrays, starts, sizes):
        packed[start : start + n] = a
    whole = to_device(packed, device)
    return [whole[start : start + n] for start, n in zip(starts.tolist(), sizes)]


class DeviceTimer:
    """Time spent on the device between start() and stop(): CUDA events on a GPU (read without
    forcing a sync before the work is done anyway), wall time on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self._start.record()
        else:
            self._t = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self._end.record()
        else:
            self._ms = (time.perf_counter() - self._t) * 1e3

    def elapsed_ms(self) -> float:
        if self.cuda:
            self._end.synchronize()
            return self._start.elapsed_time(self._end)
        return self._ms


_NUMPY = {
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.float32: np.float32,
    torch.bool: np.bool_,
}
