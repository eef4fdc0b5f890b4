"""EngineConfig: every knob of the engine in one frozen dataclass."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import Literal

import torch

CacheKind = Literal["naive", "radix"]
Policy = Literal["prefill_first", "decode_first", "mixed"]

CACHE_KINDS = ("naive", "radix")
POLICIES = ("prefill_first", "decode_first", "mixed")
# What a loaded engine can change without reloading weights, resizing the KV pool or capturing
# CUDA graphs again: the scheduler's settings (`LLM.reconfigure`).
SCHEDULER_SETTINGS = ("max_extend_tokens", "policy", "cache", "overlap", "share_threshold")


@dataclass(frozen=True)
class EngineConfig:
    """What to run and how. Built once by `LLM` / `Workbench`; `resolved()` fills the `None`s."""

    model: str = "smollm2"
    device: str | None = None  # None: cuda when present, else cpu
    dtype: str | torch.dtype | None = None  # None: float32 on cpu, bfloat16 on cuda
    page_size: int = 1
    max_extend_tokens: int = 8192  # token budget of one batch (prefill; mixed: decodes too)
    cache: CacheKind = "radix"
    max_running_reqs: int = 256  # request slots (rows of the page table)
    num_pages: int | None = None  # None: sized from memory
    max_seq_len: int | None = None  # None: the model's context, capped by `max_seq_len_cap`
    attention: str | None = None  # backend; None: "flashinfer" on cuda when installed, else "torch"
    policy: Policy = "prefill_first"
    seed: int = 0  # dummy weights and unseeded sampling
    overlap: bool | None = None  # None: on for cuda, off on cpu (where it cannot overlap)
    cuda_graph: bool = True  # capture decode batches (cuda only)
    fused_kernels: bool | None = None  # FlashInfer norm / rope / SiLU-and-mul; None: if available
    # q/k norm + RoPE + KV store in one Triton kernel (cuda only); None: if Triton exists
    fused_rope: bool | None = None
    # one-pass Triton sampling kernel (cuda only; not for top-k / top-p); None: if Triton exists
    fused_sampling: bool | None = None
    decode_tensor_cores: bool | None = None  # FlashInfer decode on tensor cores; None: for GQA
    cuda_graph_max_bs: int = 256  # largest decode batch captured; larger ones run eagerly
    memory_ratio: float = 0.9  # share of free GPU memory (after weights) given to the KV pool
    # NOTE: a cap, so a 40k-context model does not get a 40k-wide page table on a laptop.
    max_seq_len_cap: int = 8192
    kv_memory_gb: float = 1.0  # KV budget on cpu when num_pages is None
    # A waiting request that shares at least this many uncached prompt tokens with a request
    # admitted in the same batch waits for that request's prefix to be cached (0: never waits).
    share_threshold: int = 32

    def __post_init__(self) -> None:
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if self.max_extend_tokens < 1:
            raise ValueError(f"max_extend_tokens must be >= 1, got {self.max_extend_tokens}")
        if self.max_running_reqs < 1:
            raise ValueError(f"max_running_reqs must be >= 1, got {self.max_running_reqs}")
        if self.cache not in CACHE_KINDS:
            raise ValueError(f"cache must be one of {CACHE_KINDS}, got {self.cache!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not 0.0 < self.memory_ratio <= 1.0:
            raise ValueError(f"memory_ratio must be in (0, 1], got {self.memory_ratio}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")

    @property
    def torch_device(self) -> torch.device:
        if self.device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype is None:
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        if isinstance(self.dtype, torch.dtype):
            return self.dtype
        name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(
            self.dtype, self.dtype
        )
        dtype = getattr(torch, str(name), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        return dtype

    @property
    def _flashinfer(self) -> bool:
        """On a GPU with FlashInfer installed (the `gpu` extra): its kernels are the default."""
        return (
            self.torch_device.type == "cuda" and importlib.util.find_spec("flashinfer") is not None
        )

    @property
    def attention_backend(self) -> str:
        if self.attention is not None:
            return self.attention
        return "flashinfer" if self._flashinfer else "torch"

    @property
    def overlap_enabled(self) -> bool:
        return self.torch_device.type == "cuda" if self.overlap is None else self.overlap

    @property
    def cuda_graph_enabled(self) -> bool:
        return self.cuda_graph and self.torch_device.type == "cuda"

    @property
    def fused_kernels_enabled(self) -> bool:
        return self._flashinfer if self.fused_kernels is None else self.fused_kernels

    @property
    def fused_sampling_enabled(self) -> bool:
        return self._triton_kernel(self.fused_sampling)

    @property
    def fused_rope_enabled(self) -> bool:
        return self._triton_kernel(self.fused_rope)

    def _triton_kernel(self, choice: bool | None) -> bool:
        """A Triton kernel runs on cuda only; None: when Triton is installed."""
        if self.torch_device.type != "cuda":
            return False
        return importlib.util.find_spec("triton") is not None if choice is None else choice

    def with_(self, **changes) -> EngineConfig:
        return replace(self, **changes)
