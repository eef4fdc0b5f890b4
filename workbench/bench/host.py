"""`bench --profile`: where a decode step's host time goes, stage by stage, at several batch sizes.
Decode steps of exactly each batch are timed with the engine's own settings, and their host time
split by their `StageClock`'s stages: which part of a host-bound step to cut."""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import statistics
import time
from typing import NamedTuple

from ..clocks import HOST_STAGES
from ..core import SamplingParams
from ..history.roofline import decode_step_bound, roofline_spec, routed_experts
from ..llm import LLM
from .profile import profile_decode_steps
from .steps import median_experts
from .workload import prompt_vocab, random_workload

PROFILE_BATCHES = (8, 64, 256)  # --profile's decode batches when --profile-batches is not given

WARM_STEPS, MEASURED_STEPS, PROFILED_STEPS = 5, 20, 5
TOP_KERNELS = 8


class HostSplit(NamedTuple):
    """Medians over the measured decode steps of one batch size, in milliseconds."""

    batch_size: int
    step_ms: float  # between the ends of consecutive decode steps
    bound_ms: float  # the roofline's time for such a step (NaN on the CPU)
    device_ms: float
    host_ms: float  # launch + collect (without waiting) + record, measured around them
    wait_ms: float  # the host blocked on the device for the tokens
    stages: dict[str, float]  # host_ms by stage (`clocks.HOST_STAGES`)
    # on a GPU, from steps profiled through the probe (`profile.py`): (name, ms, launches) per step
    families: dict[str, float] | None = None
    kernels: list[tuple[str, float, float]] | None = None
    launches: float | None = None  # kernels per step


def host_splits(
    llm: LLM, args: argparse.Namespace, python_profile: bool = False
) -> tuple[list[HostSplit], str | None]:
    """The split at each of `args.profile_batches` the engine has slots for; with
    `python_profile`, cProfile's busiest functions over the largest batch's measured steps."""
    sizes = [
        b
        for b in args.profile_batches or PROFILE_BATCHES
        if b <= llm.scheduler.config.max_running_reqs
    ]
    splits, stats = [], None
    for i, size in enumerate(sizes):
        profiler = cProfile.Profile() if python_profile and i == len(sizes) - 1 else None
        splits.append(host_split(llm, args, size, profiler))
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
            stats = f"Python over {MEASURED_STEPS} decode steps at batch {size}:\n" + out.getvalue()
    return splits, stats


def host_split(
    llm: LLM, args: argparse.Namespace, batch_size: int, profiler: cProfile.Profile | None = None
) -> HostSplit:
    sched, cuda = llm.scheduler, llm.engine.device.type == "cuda"
    # and a few to spare (overlap runs one ahead)
    steps = WARM_STEPS + MEASURED_STEPS + 4
    prompt_len = (500, 600) if cuda else (16, 32)
    work = random_workload(batch_size, prompt_len, (steps, steps), args.seed + 3, prompt_vocab(llm))
    sp = SamplingParams(max_tokens=steps, temperature=args.temperature, ignore_eos=True)
    llm.add_requests(work.prompts, sp)
    measured, ends, seen = [], [], 0
    while len(measured) < MEASURED_STEPS:
        if profiler is not None and seen == WARM_STEPS and not measured:
            profiler.enable()  # again after a step that was not of this batch: no effect
        record = sched.step()
        if record is None:
            break
        if record.phase == "decode" and record.size == batch_size:
            seen += 1
            if seen > WARM_STEPS:
                measured.append(record)
                ends.append(time.perf_counter())
    if profiler is not None:
        profiler.disable()
    sched.abort_all()
    split = _medians(llm, args, batch_size, measured, ends)
    if not cuda or len(measured) < MEASURED_STEPS:
        return split
    profile = profile_decode_steps(llm, batch_size, PROFILED_STEPS, prompt_len, args.seed + 4)
    return split._replace(
        families=profile.family_ms(),
        kernels=profile.kernels(TOP_KERNELS),
        launches=profile.launches(),
    )


def _medians(llm: LLM, args, batch_size: int, measured: list, ends: list[float]) -> HostSplit:
    med = statistics.median
    for record in measured:
        record.complete()
    stages = {s: med(o.stage_ms()[s] for o in measured) for s in HOST_STAGES}
    kv_tokens = int(med(sum(r.cached_len for r in o.rows) for o in measured))
    bound = math.nan
    spec = roofline_spec(llm.engine.device, args.device_spec, llm.engine.num_devices)
    if spec is not None:
        experts = median_experts([routed_experts(o.routing) for o in measured])
        model_cfg = llm.engine.model_config
        bound = decode_step_bound(model_cfg, batch_size, kv_tokens, spec, experts=experts) * 1e3
    return HostSplit(
        batch_size=batch_size,
        step_ms=med(b - a for a, b in zip(ends, ends[1:])) * 1e3,
        bound_ms=bound,
        device_ms=med(o.device_ms for o in measured),
        host_ms=med(o.host_ms for o in measured),
        wait_ms=med(o.wait_ms for o in measured),
        stages=stages,
    )


def split_table(splits: list[HostSplit]) -> str:
    """One line per batch size: the step against its bound, device, host and its stages."""
    head = ["batch", "step", "bound", "x", "device", "wait", "host", *HOST_STAGES, "sum"]
    lines = ["host per decode step by stage (ms, medians):", " ".join(f"{h:>8}" for h in head)]
    for s in splits:
        ratio = s.step_ms / s.bound_ms if s.bound_ms > 0 else math.nan
        values = [s.step_ms, s.bound_ms, ratio, s.device_ms, s.wait_ms, s.host_ms]
        values += [s.stages[k] for k in HOST_STAGES] + [sum(s.stages.values())]
        lines.append(f"{s.batch_size:>8} " + " ".join(f"{v:8.3f}" for v in values))
    for s in splits:
        if s.families is not None:
            parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(s.families.items()))
            # NOTE: what recording every kernel did to the device's time is the profiler's own
            profiled = sum(v for k, v in s.families.items() if k != "idle")
            lines.append(
                f"device ms per decode step at batch {s.batch_size} ({s.launches:.0f} kernels; "
                f"profiled {profiled:.3f} ms on the device, against {s.device_ms:.3f} above) "
                f"by family: {parts}"
            )
            lines += [f"  {ms:7.3f} ms {n:5.0f}x  {name[:90]}" for name, ms, n in s.kernels]
    return "\n".join(lines)
