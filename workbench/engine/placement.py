"""Where a tensor-parallel engine's ranks run: each rank's device, the devices used, and how
many ranks share one (gloo ranks may share a GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..config import EngineConfig


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """Rank r's device: the r-th GPU from the configured one (with gloo, round the GPUs there
    are: ranks share them), or the CPU."""
    device = config.torch_device
    if device.type != "cuda":
        return device
    first = device.index or 0
    if config.tp_collectives == "gloo":
        return torch.device("cuda", first + rank % (torch.cuda.device_count() - first))
    return torch.device("cuda", first + rank)


def num_devices(config: EngineConfig) -> int:
    """The distinct devices the engine's ranks run on (fewer than the ranks when gloo's share
    GPUs): what a roofline of its steps may count on."""
    return len({rank_device(config, r) for r in range(config.tp_size)})


def ranks_on(config: EngineConfig, rank: int) -> int:
    """How many of the engine's ranks share rank `rank`'s device (1 but with gloo on fewer
    GPUs than ranks: they then share its memory)."""
    mine = rank_device(config, rank)
    return sum(rank_device(config, r) == mine for r in range(config.tp_size))
