"""The flags of `python -m workbench bench` (and those `demo` shares), and what they parse into."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .. import validate as V
from ..flags import (
    add_engine_arguments,
    add_schedule_arguments,
    flag_type,
    integer_flag,
    rate_flag,
    temperature_flag,
)
from ..instrument.window import FIELDS, StepExpression
from .bound import DEVICES
from .dataset import DATASETS
from .goodput import parse_slo


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The bench's flags. Where vLLM's or SGLang's benchmarks have a name for a setting, that
    name works too (`--num-prompts`, `--random-input-len`, `--chunked-prefill-size`, ...)."""
    # NOTE: argparse lists flags in the order they are added; the groups below keep --help's order.
    gpu = torch.cuda.is_available()
    _workload_arguments(p, gpu)
    # nano-vllm's budget (max_num_batched_tokens=16384): fewer, fuller prefill steps
    add_schedule_arguments(p, max_extend_tokens=16384, max_running_reqs=256)
    add_engine_arguments(p)
    _run_arguments(p)
    _output_arguments(p)
    _window_and_slo_arguments(p)


def _workload_arguments(p: argparse.ArgumentParser, gpu: bool) -> None:
    here = "this machine has a GPU" if gpu else "this machine has no GPU"
    p.add_argument(
        "--model",
        "--model-path",
        dest="model",
        default="dummy:qwen3-0.6b" if gpu else "tiny-qwen3",
        help=f"model name or path (dummy:qwen3-0.6b on a GPU, tiny-qwen3 on a CPU; {here})",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument(
        "--dataset-name",
        type=_dataset,
        default="random",
        metavar="NAME",
        help="the requests: 'random' (random token ids, lengths from --input-len), or a "
        "production trace arriving at its times: 'azure-conv', 'azure-code' (Azure 2023), "
        "'mooncake', 'mooncake-synthetic' (Mooncake FAST'25; prefixes shared as recorded), from "
        "the slice that ships or --dataset-path; 'trace': a plain CSV or JSON lines file",
    )
    p.add_argument(
        "--dataset-path",
        metavar="FILE",
        help="a whole trace file of --dataset-name's kind (default: the slice in data/traces/)",
    )
    p.add_argument(
        "--trace-block-size",
        type=integer_flag("trace_block_size", 1),
        metavar="N",
        help="with a trace: tokens per prefix block (the traces' 512 by default); fewer scale "
        "every length by N/512, e.g. 16 for a tiny model on a CPU",
    )
    p.add_argument(
        "--num-requests",
        "--num-prompts",
        dest="num_requests",
        type=integer_flag("num_requests", 1),
        default=256 if gpu else 16,
        help="requests in the workload, a trace's first N (256 on a GPU, 16 on a CPU)",
    )
    _length_arguments(p, gpu)
    p.add_argument(
        "--seed",
        type=integer_flag("seed", 0, 2**63 - 1),
        default=0,
        help="workload and sampling seed",
    )
    p.add_argument("--temperature", type=temperature_flag, default=0.6, help="sampling temperature")
    p.add_argument(
        "--request-rate",
        type=rate_flag("request_rate"),
        default=None,
        help="requests/s arriving as a Poisson process (default: all at once), or a trace's "
        "arrivals rescaled to this rate (default: its own; inf: all at once); adds latencies",
    )


def _length_arguments(p: argparse.ArgumentParser, gpu: bool) -> None:
    lens = (
        "%s lengths: N (each, as vLLM takes it), or MIN MAX (uniform in [MIN, MAX]); "
        "[100, 1024] on a GPU, %s on a CPU; a trace's requests have their own"
    )
    p.add_argument(
        "--input-len",
        type=int,
        nargs="+",
        metavar="N",
        help=lens % ("prompt", "[16, 128]"),
    )
    p.add_argument(
        "--output-len",
        type=int,
        nargs="+",
        metavar="N",
        help=lens % ("output", "[16, 64]"),
    )
    ratio = "with --random-range-ratio R, uniform in [N(1 - R), N(1 + R)] as vLLM does"
    for name in ("input", "output"):
        p.add_argument(
            f"--random-{name}-len",
            type=integer_flag(f"random_{name}_len", 1),
            metavar="N",
            help=f"{'prompt' if name == 'input' else 'output'} length N ({ratio})",
        )
    p.add_argument(
        "--random-range-ratio",
        type=flag_type("random_range_ratio", float, _range_ratio),
        default=0.0,
        metavar="R",
        help="see above",
    )


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device-spec",
        choices=sorted(DEVICES),
        help="the roofline's GPU (default: the one it runs on, by its name)",
    )
    p.add_argument(
        "--step-costs",
        metavar="FILE",
        help="run the twin of the engine these step costs were fitted on (StepCosts.save): no "
        "weights, each step's time predicted on a virtual clock, in which the figures are",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other EngineConfig field, e.g. --option fused_sampling=True (repeatable)",
    )
    p.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="run every combination of these values and print a table (repeatable)",
    )
    p.add_argument(
        "--save",
        metavar="DIR",
        help="write each run's history to DIR/<settings>.parquet (needs --record light or full); "
        "compare them with workbench.viz.compare_table(load_run(...) ...)",
    )


def _output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--output-file",
        "--output-json",
        "--result-filename",
        dest="output_file",
        metavar="FILE",
        help="also write the results as JSON to FILE (vLLM's --output-json, SGLang's "
        "--result-filename)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also split the host time of decode steps by stage at --profile-batches, and "
        "profile 10 decode steps at the largest batch",
    )
    p.add_argument(
        "--profile-batches",
        type=_sizes,
        metavar="B1,B2,..",
        help="with --profile: the decode batch sizes whose host time is split (default: 8,64,256)",
    )
    p.add_argument(
        "--profile-python",
        action="store_true",
        help="with --profile: cProfile's busiest functions over the largest batch's steps",
    )
    p.add_argument(
        "--profile-trace",
        metavar="FILE",
        help="Chrome trace JSON (Perfetto): with --profile, of its profiled decode steps; else "
        "with --record full or --profile-when, of the timed run, each step marked profiled or "
        "not and the window's rule in its otherData",
    )


def _window_and_slo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile-when",
        dest="profile_steps",
        type=_step_expression,
        metavar="EXPR",
        help="record full, profiling only the steps this holds for, an expression over the "
        f"step about to run (names: {', '.join(FIELDS)}; constants, comparisons, and, or, "
        "not), e.g. \"phase == 'mixed' and batch_size >= 64\"",
    )
    p.add_argument(
        "--max-profiled-steps",
        type=integer_flag("max_profiled_steps", 1),
        metavar="N",
        help="with --record full: profile only the first N steps chosen",
    )
    p.add_argument(
        "--slo",
        type=parse_slo,
        metavar="NAME:MS,..",
        help="service-level objectives in ms (ttft, tpot, itl, e2e), e.g. ttft:500,tpot:50: "
        "print goodput (requests/s meeting every one), attainment and why requests missed "
        "(records light steps when --record is off)",
    )


def resolve_record(args: argparse.Namespace) -> None:
    """--profile-when profiles steps (record full); --slo reads the records (light at least)."""
    if args.profile_steps is not None:
        if args.record == "light":
            raise ValueError("--profile-when profiles steps: it needs --record full, not light")
        args.record = "full"
    if args.slo and args.record == "off":
        args.record = "light"


def _step_expression(text: str) -> StepExpression:
    try:
        return StepExpression(text, name="--profile-when")
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dataset(name: str) -> str:
    if name != "random" and name not in DATASETS:
        raise argparse.ArgumentTypeError(
            f"{name!r} is not built in: 'random' (prompts of random token ids, lengths from "
            f"--input-len / --random-input-len) or a trace, one of {', '.join(DATASETS)}; for "
            "your own prompts use LLM.generate"
        )
    return name


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(t) for t in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"batch sizes must be integers >= 1 separated by commas (e.g. 8,64,256), got {text!r}"
        )
    return sizes


def _range_ratio(value) -> float:
    ratio = V.real("random_range_ratio", value, 0.0, 1.0, allowed="in [0, 1)")
    if ratio == 1.0:
        raise ValueError("random_range_ratio must be a finite number in [0, 1), got 1.0")
    return ratio


# a random workload's length flags (a trace's requests have their own lengths)
LENGTH_FLAGS = ("input_len", "output_len", "random_input_len", "random_output_len")
DEFAULT_LENGTHS = {False: ([16, 128], [16, 64]), True: ([100, 1024], [100, 1024])}  # by GPU


def resolve_lengths(args: argparse.Namespace) -> None:
    """`--random-input-len N` / `--random-output-len N` (with `--random-range-ratio R`) become
    the ranges `--input-len` / `--output-len` give directly; flags a trace would ignore (lengths)
    or a random workload would (a trace's file and block size) are refused, before any run."""
    traced = args.dataset_name != "random"
    _check_trace_flags(args, traced)
    r = args.random_range_ratio
    defaults = DEFAULT_LENGTHS[torch.cuda.is_available()]
    for name, default in zip(("input", "output"), defaults, strict=True):
        lens = getattr(args, f"{name}_len") or default
        if len(lens) == 1:  # one length for every request, as vLLM's --input-len
            lens = lens * 2
        if len(lens) != 2 or not 1 <= lens[0] <= lens[1]:
            raise ValueError(f"--{name}-len takes N or MIN MAX with 1 <= MIN <= MAX, got {lens}")
        setattr(args, f"{name}_len", lens)
        n = getattr(args, f"random_{name}_len")
        if n is not None:
            setattr(args, f"{name}_len", [max(1, round(n * (1 - r))), max(1, round(n * (1 + r)))])


def _check_trace_flags(args: argparse.Namespace, traced: bool) -> None:
    if traced:
        given = [name for name in LENGTH_FLAGS if getattr(args, name) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ValueError(
                f"{flag}: the trace's requests have their own lengths (--dataset-name "
                f"{args.dataset_name}); --trace-block-size N scales them by N/512"
            )
        path = args.dataset_path
        if path is not None and not Path(path).is_file():
            raise ValueError(f"--dataset-path {path!r}: no such file")
        if args.dataset_name == "trace" and path is None:
            raise ValueError("--dataset-name trace reads --dataset-path FILE (a CSV or JSON lines)")
        return
    for flag, value in (
        ("--dataset-path", args.dataset_path),
        ("--trace-block-size", args.trace_block_size),
    ):
        if value is not None:
            raise ValueError(
                f"{flag} is a trace's: give its kind too, --dataset-name {'|'.join(DATASETS)}"
            )
