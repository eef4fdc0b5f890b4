"""How much memory an engine takes: its weights, its KV pages, and what to say when it runs out."""

from __future__ import annotations

import torch

from ..config import EngineConfig
from ..distributed import TPGroup
from ..models import ModelConfig
from .placement import ranks_on


def check_weights_fit(config: EngineConfig, model: ModelConfig, device: torch.device, tp: TPGroup):
    """Refuse a model whose weights do not fit in the GPU memory free now."""
    if device.type != "cuda":
        return
    dtype = config.torch_dtype
    need = model.num_params() * dtype.itemsize // tp.size * ranks_on(config, tp.rank)
    free, _ = torch.cuda.mem_get_info(device)
    if need > free:
        raise ValueError(
            f"model {config.model!r} needs {need / 2**30:.1f} GiB for its weights in "
            f"{dtype}; the GPU has {free / 2**30:.1f} GiB free"
        )


def pages_from_memory(
    config: EngineConfig, model: ModelConfig, device: torch.device, tp: TPGroup
) -> int:
    """KV pages for `memory_ratio` of the GPU memory free now (`kv_memory_gb` on the cpu)."""
    per_token = model.kv_bytes_per_token(config.torch_dtype.itemsize) // tp.size
    if device.type == "cuda":
        # NOTE: the rest is for activations, graphs and workspaces; gloo ranks on a GPU share it
        free, _ = torch.cuda.mem_get_info(device)
        budget = free * config.memory_ratio / ranks_on(config, tp.rank)
    else:
        budget = config.kv_memory_gb * 2**30
    pages = int(budget // (per_token * config.page_size))
    if pages < 1:
        raise ValueError("no memory left for the KV cache after loading the model")
    return pages


def out_of_memory(config: EngineConfig, model: ModelConfig, num_pages: int, cause: str):
    per_token = model.kv_bytes_per_token(config.torch_dtype.itemsize)
    kv_gib = num_pages * config.page_size * per_token / 2**30
    return RuntimeError(
        f"out of GPU memory capturing CUDA graphs, after the KV pool took {kv_gib:.1f} GiB "
        f"(memory_ratio={config.memory_ratio} of the memory free when it was built): "
        "another engine (in this process or another) holds the rest. close() it, or give "
        "each engine a smaller memory_ratio (e.g. 0.4 for two side by side). "
        f"torch: {cause}"
    )
