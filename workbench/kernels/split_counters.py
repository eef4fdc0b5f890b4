"""The counters of one-launch split kernels (`small_gemm`'s K split, `decode_attention`'s KV
split): each split of an output block adds one to the block's counter after leaving its part,
and the split that counts last merges the parts in a fixed order and sets the counter back to 0."""

from __future__ import annotations

import torch

MAX_COUNTERS = 1 << 16  # output blocks of one split launch
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def split_counters(device: torch.device, blocks: int, what: str) -> torch.Tensor:
    """Zeroed int32 counters, at least `blocks` of them, shared by every split launch on the
    device (each leaves them zero again; the engine's launches on one stream do not overlap).
    One fixed buffer a device, never replaced: a CUDA graph keeps the address it captured.
    `what`: the launch, named in the error when it needs more."""
    if blocks > MAX_COUNTERS:
        raise ValueError(
            f"{what} split needs {blocks} counters, more than {MAX_COUNTERS}; pass splits=1"
        )
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_COUNTERS, dtype=torch.int32, device=device)
    return _COUNTERS[device]
