"""EngineConfig: every knob of the engine in one frozen dataclass."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Literal

import torch

from . import validate as V
from .kvcache import CACHES
from .policies import POLICIES

CacheKind = Literal["naive", "radix"]

CACHE_KINDS = tuple(CACHES)
TP_BACKENDS = ("nccl", "gloo")
DECODE_KERNELS = ("flashinfer", "triton")  # EngineConfig.decode_kernel
# how an MoE model's experts are computed: `layers.moe.MOE_BACKENDS` (a test keeps the two
# lists equal) and "auto": "triton" on a GPU when Triton is installed, else "torch"
MOE_BACKEND_CHOICES = ("auto", "torch", "triton")
MAX_GRAPH_TOKENS = 16384  # a prefill graph's inputs fit one staging segment (`device.py`)
RECORD_LEVELS = ("off", "light", "full")  # what each step keeps (instrument/probe.py)
# what `LLM.reconfigure` can change without reloading weights, the KV pool or CUDA graphs
SCHEDULER_SETTINGS = (
    "max_extend_tokens",
    "policy",
    "max_running_reqs",
    "cache",
    "overlap",
    "share_threshold",
)
# the fields that choose kernels, not the schedule (`Engine.kernels` says what they resolved to)
KERNEL_OPTIONS = (
    "attention",
    "decode_tensor_cores",
    "decode_split_kv",
    "decode_kernel",
    "fused_kernels",
    "fused_rope",
    "fused_sampling",
    "small_gemm",
    "pdl",
    "moe_backend",
)
# the names vLLM's and SGLang's users write for what a keyword here is (as the command line's
# flags accept them: flags.py), and the words a person may try first
OTHER_NAMES = {
    "max_num_seqs": "max_running_reqs",
    "max_running_requests": "max_running_reqs",
    "max_num_batched_tokens": "max_extend_tokens",
    "chunked_prefill_size": "max_extend_tokens",
    "chunk_size": "max_extend_tokens",
    "chunk": "max_extend_tokens",
    "block_size": "page_size",
    "tensor_parallel_size": "tp_size",
    "tp": "tp_size",
    "max_model_len": "max_seq_len",
    "context_length": "max_seq_len",
    "gpu_memory_utilization": "memory_ratio",
    "mem_fraction_static": "memory_ratio",
    "schedule_policy": "policy",
    "enable_prefix_caching": 'cache ("radix" or "naive")',
    "disable_radix_cache": 'cache="naive"',
    "enforce_eager": "cuda_graph=False",
    "disable_cuda_graph": "cuda_graph=False",
    "disable_overlap_schedule": "overlap=False",
}


def unknown_keyword(name: str, where: str, known: Iterable[str]) -> V.WrongType:
    """The error for keyword `name`, which `where` does not take: what it is called here, if it
    is another engine's name for one, else the keywords it does take."""
    hints = {other: f"here it is {ours}" for other, ours in OTHER_NAMES.items()}
    return V.unknown_keyword(where, name, sorted(known), hints)


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def default_page_size(device_type: str) -> int:
    return 16 if device_type == "cuda" else 1


@dataclass(frozen=True)
class EngineConfig:
    """What to run and how; a `None` field is chosen from the device."""

    model: str = "smollm2"
    device: str | None = None  # None: cuda when present, else cpu
    dtype: str | torch.dtype | None = None  # None: float32 on cpu, bfloat16 on cuda
    # None: 16 on cuda (FlashInfer reads KV a page at a time), 1 on the cpu (pages to study)
    page_size: int | None = None
    max_extend_tokens: int = 8192  # token budget of one batch (prefill; mixed: decodes too)
    cache: CacheKind = "radix"
    max_running_reqs: int = 256  # request slots (rows of the page table)
    num_pages: int | None = None  # pages of page_size tokens; None: sized from memory
    max_seq_len: int | None = None  # None: the model's context, capped by `max_seq_len_cap`
    attention: str | None = None  # backend; None: "flashinfer" on cuda when installed, else "torch"
    policy: str = "prefill_first"
    seed: int = 0  # dummy weights and unseeded sampling
    overlap: bool | None = None  # None: on for cuda, off on cpu (where it cannot overlap)
    cuda_graph: bool = True  # capture decode batches (cuda only)
    fused_kernels: bool | None = None  # FlashInfer norm / rope / SiLU-and-mul; None: if available
    fused_rope: bool | None = None  # q/k norm + RoPE + KV store in one Triton kernel
    fused_sampling: bool | None = None  # one-pass Triton sampling (not for top-k / top-p)
    # FlashInfer decode on tensor cores; None: by the GQA group and batch size
    # (attention/flashinfer_backend.py, `tensor_cores_above`)
    decode_tensor_cores: bool | None = None
    # FlashInfer's KV split in captured decode steps on tensor cores (False: a program per
    # request and KV head, no merge launch; benchmarks/decode_attention.py times both)
    decode_split_kv: bool = True
    # the kernel of decode steps' attention on the FlashInfer backend: "flashinfer", or "triton"
    # (kernels/decode_attention.py: no plan, reads the page table; about FlashInfer's speed on
    # an H100, the kernel's docstring says by how much)
    decode_kernel: str = "flashinfer"
    # linear layers of batches up to 16 rows in one Triton kernel, not cuBLAS (cuda only; off:
    # slower than cuBLAS on an H100, kernels/small_gemm.py says by how much)
    small_gemm: bool = False
    # the decode step's Triton kernels (fused rope, small_gemm, decode_kernel="triton") launched
    # with programmatic dependent launch: each may start in the tail of the kernel before it
    # (compute capability 9.0 and later; kernels/pdl.py; on an H100 the batch-8 decode step with
    # the small GEMM and Triton decode took 1.58 ms with it against 1.63 without, no gain at 64+)
    pdl: bool = False
    cuda_graph_max_bs: int = 256  # largest decode batch captured; larger ones run eagerly
    cuda_graph_max_tokens: int = 4096  # largest prefill or mixed step captured (0: none)
    # steps padded to the CUDA graphs' shapes, run eagerly, where graphs are not captured (the
    # torch attention backend, the CPU): the graphs' path, checked without a GPU
    padded_steps: bool = False
    memory_ratio: float = 0.9  # share of free GPU memory (after weights) given to the KV pool
    # NOTE: a cap, so a long-context model does not get a huge page table by default
    max_seq_len_cap: int = 8192
    kv_memory_gb: float = 1.0  # KV budget on cpu when num_pages is None
    # torch's CPU threads; None: half the cores unless OMP_NUM_THREADS is set
    # (docs/engine.md, "The CPU path under load")
    cpu_threads: int | None = None
    # a request sharing this many uncached prompt tokens with one admitted in the same batch
    # waits for that prefix to be cached (0: never waits)
    share_threshold: int = 32
    tp_size: int = 1  # tensor-parallel ranks; this process is rank 0 and schedules
    # "nccl", or "gloo" (ranks may share one GPU, without CUDA graphs); None: by device
    tp_backend: str | None = None
    warmup: bool = True  # take every path once at build so no measured step pays a first use
    moe_backend: str = "auto"  # a mixture of experts' expert computation: MOE_BACKEND_CHOICES

    def __post_init__(self) -> None:
        if not isinstance(self.model, str | os.PathLike):
            raise V.WrongType(f"model must be a name or a path, got {self.model!r}")
        device = _check_device(self.device)  # first: the default page size depends on it
        page_size = self.page_size
        if page_size is None:
            page_size = default_page_size(self.torch_device.type)
        page_size = V.integer("page_size", page_size, 1, 2**16)
        if page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two (1, 2, 4, ...), got {page_size}")
        checked = dict(
            device=device,
            page_size=page_size,
            max_extend_tokens=V.integer("max_extend_tokens", self.max_extend_tokens, 1),
            cache=V.choice("cache", self.cache, CACHE_KINDS),
            max_running_reqs=V.integer("max_running_reqs", self.max_running_reqs, 1, 2**16),
            num_pages=V.optional_integer("num_pages", self.num_pages, 1),
            max_seq_len=V.optional_integer("max_seq_len", self.max_seq_len, 1),
            policy=V.choice("policy", self.policy, sorted(POLICIES)),
            seed=V.integer("seed", self.seed, 0, 2**63 - 1),
            overlap=V.optional_boolean("overlap", self.overlap),
            cuda_graph=V.boolean("cuda_graph", self.cuda_graph),
            fused_kernels=V.optional_boolean("fused_kernels", self.fused_kernels),
            fused_rope=V.optional_boolean("fused_rope", self.fused_rope),
            fused_sampling=V.optional_boolean("fused_sampling", self.fused_sampling),
            decode_tensor_cores=V.optional_boolean("decode_tensor_cores", self.decode_tensor_cores),
            small_gemm=V.boolean("small_gemm", self.small_gemm),
            pdl=V.boolean("pdl", self.pdl),
            decode_split_kv=V.boolean("decode_split_kv", self.decode_split_kv),
            decode_kernel=V.choice("decode_kernel", self.decode_kernel, DECODE_KERNELS),
            cuda_graph_max_bs=V.integer("cuda_graph_max_bs", self.cuda_graph_max_bs, 1),
            cuda_graph_max_tokens=V.integer(
                "cuda_graph_max_tokens", self.cuda_graph_max_tokens, 0, MAX_GRAPH_TOKENS
            ),
            padded_steps=V.boolean("padded_steps", self.padded_steps),
            memory_ratio=V.real("memory_ratio", self.memory_ratio, 0.0, 1.0, low_open=True),
            max_seq_len_cap=V.integer("max_seq_len_cap", self.max_seq_len_cap, 1),
            kv_memory_gb=V.real("kv_memory_gb", self.kv_memory_gb, 0.0, low_open=True),
            cpu_threads=V.optional_integer("cpu_threads", self.cpu_threads, 1, 4096),
            share_threshold=V.integer("share_threshold", self.share_threshold, 0),
            tp_size=V.integer("tp_size", self.tp_size, 1, 64),
            warmup=V.boolean("warmup", self.warmup),
            moe_backend=V.choice("moe_backend", self.moe_backend, MOE_BACKEND_CHOICES),
        )
        if self.tp_backend is not None:
            checked["tp_backend"] = V.choice("tp_backend", self.tp_backend, TP_BACKENDS)
        if self.attention is not None:
            from .attention import BACKENDS

            checked["attention"] = V.choice("attention", self.attention, sorted(BACKENDS))
        for name, value in checked.items():  # plain Python values (numpy ints become ints)
            object.__setattr__(self, name, value)
        if self.tp_backend == "nccl" and self.torch_device.type != "cuda":
            raise ValueError(
                f"tp_backend='nccl' needs a CUDA device, device is {self.torch_device}; "
                "allowed on the cpu: 'gloo'"
            )
        if self.decode_kernel == "triton" and self.attention_backend != "flashinfer":
            raise ValueError(
                f"decode_kernel='triton' runs on the FlashInfer backend (a CUDA device with "
                f"flashinfer installed), attention is {self.attention_backend!r}; allowed there: "
                "'flashinfer'"
            )
        if self.moe_backend == "triton" and self.torch_device.type != "cuda":
            raise ValueError(
                f"moe_backend='triton' needs a CUDA device, device is {self.torch_device}; "
                "allowed on the cpu: 'torch' or 'auto'"
            )
        self.torch_dtype  # noqa: B018 (checks the dtype)

    @property
    def torch_device(self) -> torch.device:
        if self.device is None:
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype is None:
            return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32
        if not isinstance(self.dtype, str | torch.dtype):
            raise V.WrongType(f"dtype must be a string, a torch.dtype or None, got {self.dtype!r}")
        dtype = DTYPES.get(str(self.dtype).removeprefix("torch."))
        if dtype is None:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)} or None, got {self.dtype!r}")
        return dtype

    @property
    def _flashinfer(self) -> bool:
        return (
            self.torch_device.type == "cuda" and importlib.util.find_spec("flashinfer") is not None
        )

    @property
    def attention_backend(self) -> str:
        if self.attention is not None:
            return self.attention
        return "flashinfer" if self._flashinfer else "torch"

    @property
    def decode_attention(self) -> str:
        """What decode steps' attention runs on: `decode_kernel` on the FlashInfer backend, else
        the backend's own kernel ("torch")."""
        backend = self.attention_backend
        return self.decode_kernel if backend == "flashinfer" else backend

    @property
    def overlap_enabled(self) -> bool:
        return self.torch_device.type == "cuda" if self.overlap is None else self.overlap

    @property
    def tp_collectives(self) -> str:
        if self.tp_backend is not None:
            return self.tp_backend
        return "nccl" if self.torch_device.type == "cuda" else "gloo"

    @property
    def cuda_graph_enabled(self) -> bool:
        # NOTE: gloo's all-reduces of GPU tensors go through the host and cannot be captured
        gloo_ranks = self.tp_size > 1 and self.tp_collectives == "gloo"
        return self.cuda_graph and self.torch_device.type == "cuda" and not gloo_ranks

    def padded_steps_on(self, capturable: bool) -> bool:
        """Whether steps run padded to the graphs' shapes, on an attention backend whose graphs
        can be captured or not: always where CUDA graphs can be (captured or not, the same
        shapes), else when `padded_steps` asks."""
        return self.padded_steps or (capturable and self.torch_device.type == "cuda")

    @property
    def has_flashinfer(self) -> bool:
        """Whether FlashInfer runs here (a CUDA device, flashinfer installed): the fused kernels
        need it (a twin, which runs none, may still name those its runs ran)."""
        return self._flashinfer

    @property
    def fused_kernels_enabled(self) -> bool:
        return self._flashinfer if self.fused_kernels is None else self.fused_kernels

    @property
    def fused_sampling_enabled(self) -> bool:
        return self._triton_kernel(self.fused_sampling)

    @property
    def fused_rope_enabled(self) -> bool:
        return self._triton_kernel(self.fused_rope)

    @property
    def small_gemm_enabled(self) -> bool:
        return self.small_gemm and self._triton_kernel(True)

    @property
    def pdl_enabled(self) -> bool:
        """`pdl` where the GPU and Triton support it (`kernels.pdl.pdl_supported`)."""
        if not (self.pdl and self._triton_kernel(True)):
            return False
        from .kernels.pdl import pdl_supported

        return pdl_supported(self.torch_device)

    @property
    def moe_backend_used(self) -> str:
        """The MoE backend `moe_backend` names, "auto" resolved: "triton" on a GPU when Triton
        and the kernel's module are installed, else "torch"."""
        if self.moe_backend != "auto":
            return self.moe_backend
        kernel = importlib.util.find_spec("workbench.kernels.fused_moe") is not None
        return "triton" if kernel and self._triton_kernel(None) else "torch"

    def _triton_kernel(self, choice: bool | None) -> bool:
        if self.torch_device.type != "cuda":
            return False
        return importlib.util.find_spec("triton") is not None if choice is None else choice

    def with_(self, **changes) -> EngineConfig:
        return replace(self, **changes)


def _check_device(device: str | torch.device | None) -> str | None:
    if device is None:
        return None
    if not isinstance(device, str | torch.device):
        raise V.WrongType(f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (parsed.index or 0) >= count:
            raise ValueError(
                f"device {str(device)!r} is not available: torch sees {count} CUDA GPUs here"
            )
    return str(parsed)


def engine_keywords() -> tuple[str, ...]:
    """The keywords `EngineConfig` takes."""
    return tuple(f.name for f in fields(EngineConfig))
