"""Where a tensor-parallel engine's ranks run (gloo ranks may share a GPU)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..config import EngineConfig


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """Rank r's device: the r-th GPU from the configured one (with gloo, modulo the GPUs)."""
    device = config.torch_device
    if device.type != "cuda":
        return device
    first = device.index or 0
    if config.tp_collectives == "gloo":
        return torch.device("cuda", first + rank % (torch.cuda.device_count() - first))
    return torch.device("cuda", first + rank)


def num_devices(config: EngineConfig) -> int:
    """The distinct devices the engine's ranks run on: what a roofline may count on."""
    return len({rank_device(config, r) for r in range(config.tp_size)})


def ranks_on(config: EngineConfig, rank: int) -> int:
    """How many of the engine's ranks share rank `rank`'s device (and so its memory)."""
    mine = rank_device(config, rank)
    return sum(rank_device(config, r) == mine for r in range(config.tp_size))


def use_cpu_threads(config: EngineConfig) -> None:
    """Torch's threads on a CPU: `cpu_threads`, else half the cores (one per core loses to load)."""
    if config.torch_device.type != "cpu":
        return
    if config.cpu_threads is not None:
        torch.set_num_threads(config.cpu_threads)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))


def check_gpus(config: EngineConfig) -> None:
    """Raise unless a tensor-parallel engine on NCCL has a GPU per rank."""
    device = config.torch_device
    if device.type != "cuda" or config.tp_collectives == "gloo":
        return
    have = torch.cuda.device_count() - (device.index or 0)
    if have < config.tp_size:
        raise ValueError(
            f"tp_size={config.tp_size} needs {config.tp_size} GPUs from {device}; "
            f"{have} found (allowed: 1 to {have}; or tp_backend='gloo', whose ranks share "
            "GPUs, to study tensor parallelism on fewer)"
        )
