"""The offline throughput benchmark's timed run: a warm-up generate on other prompts, then one
timed generate of the workload (EOS ignored), and its figures against the roofline bound."""

from __future__ import annotations

import argparse
import gc
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from ..core import SamplingParams
from ..flags import llm_options
from ..history.roofline import roofline_spec
from ..history.trace import export_trace
from ..llm import LLM
from .bound import workload_bound
from .dataset import bench_workload, reuse_result
from .goodput import slo_result
from .host import PROFILE_BATCHES, host_splits, split_table
from .online import latency_summary, poisson_arrivals, serve
from .profile import profile_decode_steps, profile_text
from .steps import StepTime, decode_step, prompt_steps, split_time, step_time
from .workload import Workload, prompt_vocab, random_workload


def run_bench(args: argparse.Namespace) -> dict:
    """One run: build the engine, warm it up, time one generate of the workload; the result is
    its settings and figures, the fields `--json` prints."""
    check_run(args)
    llm = build_llm(args)
    work, trace = bench_workload(llm, args)
    warm_up(llm, args)
    run = timed_run(llm, work, args)
    llm.check_integrity()
    saved = save_run(llm, args) if args.save else None
    result = {**summary(llm, args, work, run), **({"saved": str(saved)} if saved else {})}
    if trace is not None:
        result |= {"trace": trace.summary(), "prefix_reuse": reuse_result(trace, run.cached)}
    if args.profile_trace and not args.profile and args.record == "full":
        history = llm.history  # each step marked profiled or not, the window in its otherData
        export_trace(history.steps, history.events, args.profile_trace, llm.run_meta())
        result["profile_trace"] = args.profile_trace
    if args.slo and args.record != "off":  # (a sweep of record=off,...: none to read)
        result["slo"] = slo_result(llm.history, args.slo)
    if args.profile:
        splits, python = host_splits(llm, args, args.profile_python)
        result["host_split"] = [s._asdict() for s in splits]
        result["profile"] = "\n".join([split_table(splits), *([python] if python else [])])
        cuda = llm.engine.device.type == "cuda"
        slots = llm.scheduler.config.max_running_reqs
        batch = max(
            (b for b in args.profile_batches or PROFILE_BATCHES if b <= slots), default=slots
        )
        profile = profile_decode_steps(
            llm,
            batch,
            10,
            (500, 600) if cuda else (16, 32),
            args.seed + 2,
            args.temperature,
            trace=args.profile_trace,
        )
        result["profile"] += "\n" + profile_text(profile)
    return result


def build_llm(args: argparse.Namespace) -> LLM:
    """The engine the flags describe; with --step-costs, its twin."""
    if args.step_costs is None:
        return LLM(args.model, **llm_options(args))
    from ..twin import load_step_costs

    if args.profile:
        raise ValueError("--profile times the host's work: a twin (--step-costs) only predicts it")
    return LLM(args.model, step_costs=load_step_costs(args.step_costs), **llm_options(args))


def warm_up(llm: LLM, args: argparse.Namespace) -> None:
    warm = random_workload(
        min(32, args.num_requests), args.input_len, (8, 16), args.seed + 1, prompt_vocab(llm)
    )
    llm.generate(warm.prompts, SamplingParams(max_tokens=16, temperature=args.temperature))
    llm.scheduler.abort_all()  # the timed run starts at step 0 with an empty cache and history


class TimedRun(NamedTuple):
    """What the timed generate measured, on the run's clock (a twin's is virtual)."""

    start: float  # the clock at its start: where the first step's time begins
    seconds: float
    output_tokens: int
    steps: list[StepTime]
    collections: GcWatch  # stopped: its counts are final
    latency: dict  # TTFT, TPOT and end-to-end percentiles of arriving requests; else empty
    read_seconds: float  # --record full: reading the profiler's events after the run
    cached: list[int]  # each request's prompt tokens found in the prefix cache at admission
    idle: list[tuple[float, float]]  # spans waiting for a request to arrive, nothing to step


# a run whose requests arrive over more than this says so before it waits for them
LONG_ARRIVALS_S = 60.0


def timed_run(llm: LLM, work: Workload, args: argparse.Namespace) -> TimedRun:
    """The workload's generate (with --request-rate, its requests served as they arrive) between
    device syncs, recording each step's time and the garbage collector's passes."""
    params = [
        SamplingParams(max_tokens=n, temperature=args.temperature, ignore_eos=True)
        for n in work.output_lens
    ]
    steps: list[StepTime] = []
    clock = llm.scheduler.clock
    # on a terminal: requests finished and tokens so far (tqdm redraws a few times a second)
    quiet = not sys.stderr.isatty()
    bar = tqdm(total=len(work.prompts), unit="req", desc="bench", leave=False, disable=quiet)
    tokens = 0

    def on_step(record) -> None:
        nonlocal tokens
        steps.append(step_time(record, clock.now()))
        if not bar.disable:
            tokens += sum(t is not None for t in record.tokens)
            bar.set_postfix(tokens=tokens, refresh=False)
            bar.update(len(record.finished))

    sync = torch.cuda.synchronize if llm.engine.device.type == "cuda" else (lambda: None)
    gc.collect()
    collections = GcWatch()
    sync()
    start = clock.now()
    idle: list[tuple[float, float]] = []
    try:
        output_tokens, latency, cached = _generate(llm, work, params, args, on_step, idle)
    finally:
        bar.close()
    sync()
    seconds = clock.now() - start
    collections.stop()
    # NOTE: the profiler's events are read when first looked at, after the run (timed apart)
    read = time.perf_counter()
    llm.history.fill_in()
    read_seconds = time.perf_counter() - read
    return TimedRun(
        start, seconds, output_tokens, steps, collections, latency, read_seconds, cached, idle
    )


def _generate(
    llm: LLM,
    work: Workload,
    params: list[SamplingParams],
    args: argparse.Namespace,
    on_step: Callable,
    idle: list[tuple[float, float]],
) -> tuple[int, dict, list[int]]:
    """Output tokens, latencies (when requests arrive over time) and cached tokens per request;
    `idle` gets the spans the run waited for a request to arrive."""
    arrivals = work.arrivals  # a trace's (already at --request-rate)
    if arrivals is None and args.request_rate is None:
        outputs = llm.generate(work.prompts, params, on_step=on_step)
        cached = [o["cached_tokens"] for o in outputs]
        return sum(o["completion_tokens"] for o in outputs), {}, cached
    if arrivals is None:
        arrivals = poisson_arrivals(len(work.prompts), args.request_rate, args.seed)
    if llm.step_costs is None:  # (a twin's clock jumps to an arrival: no wait)
        at = "the trace's times" if work.arrivals else f"--request-rate {args.request_rate}/s"
        say_a_long_wait(arrivals, at)
    timings = serve(llm, work.prompts, params, arrivals, on_step=on_step, idle=idle)
    cached = [t.cached_tokens for t in timings]
    return sum(t.output_tokens for t in timings), latency_summary(timings), cached


def say_a_long_wait(arrivals: list[float], at: str) -> None:
    """On stderr, where the last request arrives later than `LONG_ARRIVALS_S` (`at`: what set
    the times): a rate far lower than meant (`--request-rate 1e-9`) would otherwise look like a
    run that hangs."""
    if arrivals and arrivals[-1] > LONG_ARRIVALS_S:
        print(
            f"bench: the last of {len(arrivals)} requests arrives {arrivals[-1]:,.1f} s after the "
            f"start at {at}; the run waits for it",
            file=sys.stderr,
        )


def summary(llm: LLM, args: argparse.Namespace, work: Workload, run: TimedRun) -> dict:
    """The result: what ran, then what it measured (the JSON fields, in their order)."""
    # the step split over GPUs; None on the CPU, in a twin, or on a GPU of no known spec
    twin = llm.step_costs is not None
    engine, model_cfg = llm.engine, llm.engine.model_config
    spec = None if twin else roofline_spec(engine.device, args.device_spec, engine.num_devices)
    gpu = spec is not None
    bound = workload_bound(model_cfg, work.prompt_lens, work.output_lens, spec) if gpu else None
    split = split_time(run.steps, run.start, run.idle)
    top = decode_step(run.steps, model_cfg, spec)
    prompt = prompt_steps(run.steps)
    return dict(
        **settings(llm, args, work),
        output_tokens=run.output_tokens,
        seconds=round(run.seconds, 3),
        events_read_seconds=round(run.read_seconds, 3) if args.record == "full" else None,
        output_tokens_per_s=round(run.output_tokens / run.seconds, 1),
        steps=len(run.steps),
        roofline_device=spec.name if gpu else None,
        roofline_tokens_per_s=round(bound.tokens_per_second, 1) if gpu else None,
        roofline_fraction=round(bound.seconds / run.seconds, 3) if gpu else None,
        phase_seconds={p: round(sum(v), 3) for p, v in split.by_phase.items()},
        phase_steps={p: len(v) for p, v in split.by_phase.items()},
        idle_seconds=round(split.idle, 3),  # waiting for a request to arrive, nothing to step
        decode_by_batch={k: (len(v), round(sum(v), 3)) for k, v in split.by_batch.items()},
        gc_collections=run.collections.count,
        gc_full_collections=run.collections.full,
        gc_seconds=round(run.collections.seconds, 3),
        decode_batch=top.batch_size,
        decode_step_ms=round(top.step_ms, 3),
        decode_step_kv_tokens=top.kv_tokens,
        decode_step_bound_ms=round(top.bound_ms, 3) if gpu else None,
        # an MoE model's experts touched per MoE layer (of `experts`), read by that bound
        decode_step_experts_touched=_rounded(top.experts_touched, 1),
        decode_launch_ms=round(top.host.launch_ms, 3),
        decode_wait_ms=round(top.host.wait_ms, 3),
        decode_collect_ms=round(top.host.collect_ms, 3),
        prompt_steps=prompt.steps,
        prompt_step_tokens=prompt.tokens,
        prompt_step_forward_ms=round(prompt.forward_ms, 3),
        prompt_step_device_ms=round(prompt.device_ms, 3),
        prompt_step_graphs=prompt.graphs,
        request_rate=args.request_rate,
        profiled_steps=int(llm.history.steps.profiled.sum()) if args.record == "full" else None,
        profile_steps=llm.scheduler.probe.window.text if args.record == "full" else None,
        **run.latency,
    )


def settings(llm: LLM, args: argparse.Namespace, work: Workload) -> dict:
    """What ran: the model, the device, and the settings as the engine resolved them."""
    engine = llm.engine
    if llm.step_costs is not None:
        device = f"a twin of {engine.simulates}"
    else:
        device = torch.cuda.get_device_name() if engine.device.type == "cuda" else "cpu"
    lens, traced = work.prompt_lens, work.arrivals is not None
    return dict(
        model=args.model,
        device=device,
        dtype=str(engine.dtype).removeprefix("torch."),
        overlap=llm.scheduler.overlap,
        tp_size=engine.tp.size,
        tp_backend=engine.config.tp_collectives,
        cuda_graph=engine.captures_graphs,
        kernels=engine.kernels,  # a twin's: its runs' (None where they do not say)
        page_size=engine.config.page_size,
        max_extend_tokens=args.max_extend_tokens,
        max_running_reqs=args.max_running_reqs,
        cache=args.cache,
        policy=engine.config.policy,
        record=args.record,
        dataset=args.dataset_name,
        num_requests=len(work.prompts),
        input_len=[min(lens), max(lens)] if traced else args.input_len,
        output_len=[min(work.output_lens), max(work.output_lens)] if traced else args.output_len,
    )


class GcWatch:
    """Counts the garbage collector's passes (and their time) until stop()."""

    def __init__(self) -> None:
        self.count, self.full, self.seconds, self._t = 0, 0, 0.0, 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.count += 1
            self.full += info["generation"] == 2
            self.seconds += time.perf_counter() - self._t

    def stop(self) -> None:
        gc.callbacks.remove(self._on_gc)


def check_run(args: argparse.Namespace) -> None:
    """What the run's flags ask that no run can give, or that would be ignored, before any
    runs (a sweep's runs each: it may vary --record)."""
    if args.num_requests < 1:
        raise ValueError(f"--num-requests must be at least 1, got {args.num_requests}")
    needs = (
        ("--profile-batches", args.profile_batches is not None, args.profile, "--profile"),
        ("--profile-python", args.profile_python, args.profile, "--profile"),
        (
            "--max-profiled-steps",
            args.max_profiled_steps is not None,
            args.record == "full",
            "--record full or --profile-when",
        ),
        (
            "--profile-trace",
            args.profile_trace is not None,
            args.profile or args.record == "full",
            "--profile, --record full or --profile-when",
        ),
    )
    for flag, given, met, what in needs:
        if given and not met:
            raise ValueError(f"{flag} does nothing without {what}")
    if args.save and args.record == "off":
        raise ValueError("--save writes the run's history: it needs --record light or full")
    if args.save and Path(args.save).exists() and not Path(args.save).is_dir():
        raise ValueError(f"--save takes a directory; {args.save!r} is a file")


def save_run(llm: LLM, args: argparse.Namespace) -> Path:
    """The timed run's history as a saved run, named after the settings a sweep varied."""
    varied = getattr(args, "varied", {})  # absent outside a sweep
    name = "_".join(f"{k}={v}" for k, v in varied.items()) or "run"
    name = re.sub(r"[^A-Za-z0-9=._-]+", "-", name)
    meta = {**llm.run_meta(), **({"slo": args.slo} if args.slo else {})}  # (the SLO chart's)
    return llm.history.save(Path(args.save) / f"{name}.parquet", meta)


def _rounded(value: float, digits: int) -> float | None:
    """`value` rounded, None where it is NaN (JSON has no NaN)."""
    return None if math.isnan(value) else round(value, digits)
