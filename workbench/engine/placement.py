"""Where a tensor-parallel engine's ranks run: each rank's device, the devices used, and how
many ranks share one (gloo ranks may share a GPU)."""

from __future__ import annotations

import os
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


def use_cpu_threads(config: EngineConfig) -> None:
    """Torch's threads for a CPU engine: `cpu_threads`, or half the cores (at least one) when
    OMP_NUM_THREADS does not say. Measured on the 2-core machine (SmolLM2, decode at batch 4):
    idle, one thread and two take the same (228 and 226 ms a step); with another process busy
    on one core, one thread takes 207 ms and two 545 (torch's threads wait for each other, and
    one of them for the busy core). A thread per core gains nothing idle and loses most under
    load."""
    if config.torch_device.type != "cpu":
        return
    if config.cpu_threads is not None:
        torch.set_num_threads(config.cpu_threads)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))


def check_gpus(config: EngineConfig) -> None:
    """A tensor-parallel engine on NCCL has a GPU per rank."""
    device = config.torch_device
    if device.type != "cuda" or config.tp_collectives == "gloo":  # gloo's ranks share GPUs
        return
    have = torch.cuda.device_count() - (device.index or 0)
    if have < config.tp_size:
        raise ValueError(
            f"tp_size={config.tp_size} needs {config.tp_size} GPUs from {device}; "
            f"{have} found (allowed: 1 to {have}; or tp_backend='gloo', whose ranks share "
            "GPUs, to study tensor parallelism on fewer)"
        )
