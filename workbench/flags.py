"""The command line's flags that `demo` and `bench` share, and the one way from flags to `LLM`
keywords (`llm_options`)."""

from __future__ import annotations

import argparse
import ast

from .config import CACHE_KINDS, MOE_BACKEND_CHOICES, RECORD_LEVELS, TP_BACKENDS
from .policies import POLICIES

# flags whose value is the `LLM` keyword of the same name, in the commands that have them
LLM_FLAGS = (
    "device",
    "page_size",
    "max_extend_tokens",
    "max_running_reqs",
    "cache",
    "policy",
    "overlap",
    "cuda_graph",
    "fused_kernels",
    "moe_backend",
    "record",
    "profile_steps",
    "max_profiled_steps",
    "tp_size",
    "tp_backend",
)


def llm_options(args: argparse.Namespace) -> dict:
    """The `LLM` keywords the parsed flags give: ``LLM(args.model, **llm_options(args))``."""
    options = {name: getattr(args, name) for name in LLM_FLAGS if hasattr(args, name)}
    return {**options, **engine_options(getattr(args, "option", []))}


def add_schedule_arguments(
    p: argparse.ArgumentParser, max_extend_tokens: int, max_running_reqs: int
) -> None:
    """The schedule's flags `demo`, `bench` and `serve` share, under our names and SGLang's."""
    p.add_argument(
        "--policy", default="prefill_first", choices=sorted(POLICIES), help="batch policy"
    )
    p.add_argument(
        "--max-extend-tokens",
        "--chunked-prefill-size",
        "--max-num-batched-tokens",
        dest="max_extend_tokens",
        type=int,
        default=max_extend_tokens,
        help="the token budget of a batch: the prefill chunk size (SGLang's "
        "--chunked-prefill-size, vLLM's --max-num-batched-tokens)",
    )
    p.add_argument(
        "--max-running-reqs",
        "--max-running-requests",
        "--max-num-seqs",
        dest="max_running_reqs",
        type=int,
        default=max_running_reqs,
        help="request slots (SGLang's --max-running-requests, vLLM's --max-num-seqs)",
    )
    p.add_argument(
        "--page-size",
        "--block-size",
        dest="page_size",
        type=int,
        default=None,
        help="tokens per KV page (vLLM's --block-size; default: 16 on a GPU, 1 on a CPU)",
    )
    p.add_argument(
        "--enable-chunked-prefill",
        action="store_true",
        help="accepted for vLLM's sake: prompts are always chunked here, by --max-extend-tokens",
    )
    p.add_argument("--cache", default="radix", choices=CACHE_KINDS, help="prefix cache")
    p.add_argument(
        "--disable-radix-cache",
        dest="cache",
        action="store_const",
        const="naive",
        help="the same as --cache naive",
    )


def engine_options(pairs: list[str]) -> dict:
    """`--option KEY=VALUE` pairs as EngineConfig keyword arguments."""
    options = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"--option takes KEY=VALUE (e.g. max_seq_len=2048), got {pair!r}")
        if key in OWN_FLAGS:
            raise ValueError(f"--option {key}=... : {key} has a flag of its own, {OWN_FLAGS[key]}")
        options[key] = parse_value(value)
    return options


# LLM's keywords that are not engine options: each is a flag of the commands that take it
OWN_FLAGS = {
    "model": "--model",
    "step_costs": "--step-costs",
    "profile_steps": "--profile-when (bench)",
    "max_profiled_steps": "--max-profiled-steps (bench)",
}


def parse_value(text: str):
    """A Python literal where the text is one (`True`, `8`, `0.5`; `true` and `false` as a
    shell user writes them), else the text itself."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def add_engine_arguments(p: argparse.ArgumentParser, record: str = "off") -> None:
    """The engine's flags `bench` and `serve` share, under our names, SGLang's and vLLM's."""
    overlap_help = "overlap scheduling (default: on with CUDA, off on a CPU)"
    _on_off(p, "overlap", None, overlap_help, also="--disable-overlap-schedule")
    graph_help = (
        "CUDA graphs for decode, prefill and mixed steps, "
        "up to --option cuda_graph_max_tokens=N tokens (default: on)"
    )
    _on_off(p, "cuda-graph", True, graph_help, also="--disable-cuda-graph")
    p.add_argument(
        "--fused-kernels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="FlashInfer's fused norm, rope and SiLU kernels (default: where installed)",
    )
    p.add_argument(
        "--moe-backend",
        default="auto",
        choices=MOE_BACKEND_CHOICES,
        help="a mixture of experts' expert computation (default auto: the fused Triton kernel "
        "on a GPU, torch elsewhere)",
    )
    p.add_argument("--record", default=record, choices=RECORD_LEVELS, help="step records kept")
    p.add_argument(
        "--tp-size",
        "--tensor-parallel-size",
        dest="tp_size",
        type=int,
        default=1,
        help="tensor parallelism: GPUs (CPU processes) the model is split across; the engine "
        "starts the other ranks, or under `torchrun --nproc-per-node N` uses torchrun's",
    )
    p.add_argument(
        "--tp-backend",
        choices=TP_BACKENDS,
        help="the ranks' collectives (default: nccl on GPUs, gloo on the CPU; gloo ranks may "
        "share a GPU, without CUDA graphs)",
    )


def _on_off(p: argparse.ArgumentParser, name: str, default, text: str, also: str) -> None:
    """`--name` / `--no-name`, and `also` (SGLang's `--disable-...`) for `--no-name`."""
    p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=default, help=text)
    p.add_argument(
        also, dest=name.replace("-", "_"), action="store_false", help=f"the same as --no-{name}"
    )
