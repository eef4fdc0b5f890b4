"""Host-to-device copies that never stall the host.

A copy from pageable host memory makes CUDA wait for the stream to drain first, which would undo
overlap scheduling (the host would wait for the batch in flight). Everything the scheduler sends
per step goes through a pinned staging tensor instead; torch's pinned allocator keeps it alive
until the copy has run.
"""

from __future__ import annotations

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


_NUMPY = {
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.float32: np.float32,
    torch.bool: np.bool_,
}
