"""The command line's flags that `demo` and `bench` share, and the one way from flags to `LLM`
keywords (`llm_options`)."""

from __future__ import annotations

import argparse
import ast
import math
from collections.abc import Callable
from typing import Any

from . import validate as V
from .config import CACHE_KINDS, DTYPES, MOE_BACKEND_CHOICES, RECORD_LEVELS, TP_BACKENDS
from .core import SamplingParams
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
    "max_seq_len",
    "dtype",
)


def llm_options(args: argparse.Namespace) -> dict:
    """The `LLM` keywords the parsed flags give: ``LLM(args.model, **llm_options(args))``."""
    options = {name: getattr(args, name) for name in LLM_FLAGS if hasattr(args, name)}
    return {**options, **engine_options(getattr(args, "option", []))}


def flag_type(name: str, convert: Callable[[str], Any], check: Callable[[Any], Any]):
    """An argparse `type`: the text converted, then checked as the Python API checks keyword
    `name`, so that a bad value is refused as a bad flag (argparse names the flag, the check the
    keyword, the value and what is allowed) before any model loads."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = text  # (the check says what it wanted)
        try:
            return check(value)
        except (ValueError, V.WrongType) as exc:
            # (every flag's value is text: "got 'abc' (a str)" says nothing the flag does not)
            raise argparse.ArgumentTypeError(str(exc).replace(" (a str)", "")) from None

    parse.__name__ = name  # (what argparse says of any other failure)
    return parse


def integer_flag(name: str, low: int | None = None, high: int | None = None):
    """An argparse `type`: an integer in [low, high], as `V.integer(name, ...)` takes it."""
    return flag_type(name, int, lambda value: V.integer(name, value, low, high))


# an argparse `type`: a temperature `SamplingParams` takes (0: greedy)
temperature_flag = flag_type(
    "temperature", float, lambda t: SamplingParams(temperature=t).temperature
)


def rate_flag(name: str):
    """An argparse `type`: a rate > 0 per second, or inf (all at once)."""

    def check(value):
        if isinstance(value, float) and value == math.inf:
            return value
        return V.real(name, value, 0.0, low_open=True, allowed="> 0 (per second), or inf")

    return flag_type(name, float, check)


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
        type=integer_flag("max_extend_tokens", 1),
        default=max_extend_tokens,
        help="the token budget of a batch: the prefill chunk size (SGLang's "
        "--chunked-prefill-size, vLLM's --max-num-batched-tokens)",
    )
    p.add_argument(
        "--max-running-reqs",
        "--max-running-requests",
        "--max-num-seqs",
        dest="max_running_reqs",
        type=integer_flag("max_running_reqs", 1, 2**16),
        default=max_running_reqs,
        help="request slots (SGLang's --max-running-requests, vLLM's --max-num-seqs)",
    )
    p.add_argument(
        "--page-size",
        "--block-size",
        dest="page_size",
        type=integer_flag("page_size", 1, 2**16),
        default=None,
        help="tokens per KV page (vLLM's --block-size; default: 16 on a GPU, 1 on a CPU)",
    )
    p.add_argument(
        "--enable-chunked-prefill",
        action="store_true",
        help="accepted for vLLM's sake: prompts are always chunked here, by --max-extend-tokens",
    )
    p.add_argument("--cache", default="radix", choices=CACHE_KINDS, help="prefix cache")
    for flag, cache in (
        ("--disable-radix-cache", "naive"),  # SGLang's
        ("--no-enable-prefix-caching", "naive"),  # vLLM's
        ("--enable-prefix-caching", "radix"),
    ):
        p.add_argument(
            flag,
            dest="cache",
            action="store_const",
            const=cache,
            help=f"the same as --cache {cache}",
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
    _on_off(p, "overlap", None, overlap_help, "--disable-overlap-schedule")
    graph_help = (
        "CUDA graphs for decode, prefill and mixed steps, "
        "up to --option cuda_graph_max_tokens=N tokens (default: on)"
    )
    _on_off(p, "cuda-graph", True, graph_help, "--disable-cuda-graph", "--enforce-eager")
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
        "--tp",
        dest="tp_size",
        type=integer_flag("tp_size", 1, 64),
        metavar="N",
        default=1,
        help="tensor parallelism: GPUs (CPU processes) the model is split across; the engine "
        "starts the other ranks, or under `torchrun --nproc-per-node N` uses torchrun's",
    )
    p.add_argument(
        "--max-seq-len",
        "--max-model-len",
        "--context-length",
        dest="max_seq_len",
        type=integer_flag("max_seq_len", 1),
        metavar="N",
        help="the longest request, prompt and output, in tokens (vLLM's --max-model-len, "
        "SGLang's --context-length; default: the model's context, at most 8192)",
    )
    p.add_argument(
        "--dtype",
        type=_dtype,
        default=None,
        help="the weights' and activations' dtype: auto (float32 on a CPU, bfloat16 on CUDA), "
        "float32, bfloat16, float16 (vLLM's half and float too)",
    )
    ratio = (
        "the KV pool takes a share of the GPU memory free after the weights are loaded: "
        "--option memory_ratio=R (default 0.9), or a size with --option num_pages=N"
    )
    for flag in ("--gpu-memory-utilization", "--mem-fraction-static"):
        p.add_argument(flag, action=Unlike, instead=f"not a share of the whole GPU here; {ratio}")
    p.add_argument(
        "--tp-backend",
        choices=TP_BACKENDS,
        help="the ranks' collectives (default: nccl on GPUs, gloo on the CPU; gloo ranks may "
        "share a GPU, without CUDA graphs)",
    )


def _on_off(p: argparse.ArgumentParser, name: str, default, text: str, *also: str) -> None:
    """`--name` / `--no-name`, and `also` (SGLang's `--disable-...`, vLLM's `--enforce-eager`)
    for `--no-name`."""
    p.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=default, help=text)
    for flag in also:
        dest = name.replace("-", "_")
        p.add_argument(flag, dest=dest, action="store_false", help=f"the same as --no-{name}")


class Unlike(argparse.Action):
    """A flag of vLLM's or SGLang's whose meaning differs here: refused, saying what to use."""

    def __init__(self, option_strings, dest, instead: str, **kwargs) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string}: {self.instead}")


# vLLM's names for our dtypes (`auto`: the engine's choice, float32 on a CPU, bfloat16 on CUDA)
DTYPE_NAMES = {"auto": None, "half": "float16", "float": "float32"}


def _dtype(text: str) -> str | None:
    name = DTYPE_NAMES.get(text, text)
    if name is not None and name not in DTYPES:
        raise argparse.ArgumentTypeError(
            f"dtype must be auto, {', '.join(DTYPES)}, half or float, got {text!r}"
        )
    return name
