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


_NUMPY = {
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.float32: np.float32,
    torch.bool: np.bool_,
}
