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
        page = per_token * config.page_size
        if device.type != "cuda":
            raise ValueError(
                f"kv_memory_gb={config.kv_memory_gb} holds no page of the KV cache ({page:,} "
                f"bytes: {_tokens(config.page_size)} of {per_token:,}); give at least "
                f"{page / 2**30:.2g}, or num_pages"
            )
        raise ValueError(
            f"no memory left for the KV cache after loading the model: memory_ratio="
            f"{config.memory_ratio} of the {free / 2**30:.1f} GiB free is less than a page "
            f"({page:,} bytes)"
        )
    return pages


def check_kv_fits(
    config: EngineConfig, model: ModelConfig, device: torch.device, tp: TPGroup, pages: int
) -> None:
    """Refuse a KV pool larger than the memory available now, naming what sized it."""
    per_token = model.kv_bytes_per_token(config.torch_dtype.itemsize) // tp.size
    need = pages * config.page_size * per_token
    if device.type == "cuda":  # (with what torch's allocator holds cached: it is free to it)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        available, where = torch.cuda.mem_get_info(device)[0] + cached, "the GPU has free"
    else:
        import psutil

        available, where = psutil.virtual_memory().available, "the host has available"
    if need <= available:
        return
    most = available // (config.page_size * per_token)
    asked = (
        f"num_pages={config.num_pages:,}"
        if config.num_pages
        else f"kv_memory_gb={config.kv_memory_gb}"
    )
    raise ValueError(
        f"{asked} asks for a KV cache of {need / 2**30:,.1f} GiB ({pages:,} pages of "
        f"{_tokens(config.page_size)}, {per_token:,} bytes a token); {where} "
        f"{available / 2**30:,.1f} GiB: at most {most:,} pages"
    )


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


def _tokens(n: int) -> str:
    return f"{n} token{'s' * (n != 1)}"
