"""`bench --profile`: torch.profiler over decode steps of a full batch; where the device idled."""

from __future__ import annotations

import argparse
from typing import NamedTuple

import torch

from ..core import SamplingParams
from ..history.families import family
from ..instrument.profiler import activities
from ..llm import LLM
from .workload import random_workload


def profile_decode(llm: LLM, args: argparse.Namespace) -> str:
    """torch.profiler over 10 decode steps of a full batch: where the time goes, CPU and GPU."""
    from torch.profiler import profile

    work = random_workload(args.max_running_reqs, (500, 600), (40, 40), args.seed + 2)
    sp = SamplingParams(max_tokens=40, temperature=args.temperature, ignore_eos=True)
    llm.add_requests(work.prompts, sp)
    sched = llm.scheduler
    while sched.prefill.queue:
        sched.step()
    for _ in range(5):
        sched.step()
    cuda = llm.engine.device.type == "cuda"
    with profile(activities=activities(llm.engine.device)) as prof:
        for _ in range(10):
            sched.step()
        if cuda:
            torch.cuda.synchronize()
    while sched.step() is not None:
        pass
    sched.finished.clear()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=25)
    cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    if args.profile_trace:
        prof.export_chrome_trace(args.profile_trace)
    extra = [device_gaps(prof, steps=10), by_family(prof, steps=10)] if cuda else []
    return "\n".join([table, cpu, *extra])


def by_family(prof, steps: int) -> str:
    """Device time per step by kernel family (with TP, `communication` is rank 0's collectives)."""
    totals = family_ms(kernel_times(prof, steps))
    parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(totals.items()))
    return f"device ms per decode step by family: {parts}"


def kernel_times(prof, steps: int) -> dict[str, tuple[float, float]]:
    """Each kernel's device ms and launches per step, by name, from a profiler's events."""
    from torch.autograd import DeviceType

    times: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            t = times.setdefault(e.name, [0.0, 0.0])
            t[0] += e.time_range.elapsed_us() / 1e3 / steps
            t[1] += 1 / steps
    return {name: (ms, n) for name, (ms, n) in times.items()}


def family_ms(kernels: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Device ms per step by kernel family, from `kernel_times`."""
    totals: dict[str, float] = {}
    for name, (ms, _) in kernels.items():
        fam = family(name, "kernel")
        totals[fam] = totals.get(fam, 0.0) + ms
    return totals


class Span(NamedTuple):
    """One device event, in the profiler's microseconds."""

    start: float
    end: float
    name: str


class Gap(NamedTuple):
    """Time the device sat idle between two events (ordered by length first)."""

    us: float
    after: str  # the event that ended before it
    before: str  # the event that started after it


def device_gaps(prof, steps: int) -> str:
    """How busy the device was over the profiled steps, and where it sat idle."""
    from torch.autograd import DeviceType

    spans = sorted(
        Span(e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    )
    if not spans:
        return "no device activity recorded"
    busy, gaps, end, prev = 0.0, [], spans[0].start, spans[0].name
    for span in spans:
        if span.start > end:
            gaps.append(Gap(span.start - end, prev, span.name))
        if span.end > end:
            busy += span.end - max(span.start, end)
            end, prev = span.end, span.name
    total = end - spans[0].start
    idle = sum(g.us for g in gaps)
    largest = sorted(gaps, reverse=True)[:5]
    lines = [
        f"device busy {busy / total:.1%} of {total / 1e3:.2f} ms over {steps} steps; idle "
        f"{idle / steps / 1e3:.3f} ms per step in {len(gaps)} gaps "
        f"({sum(g.us > 20 for g in gaps)} over 20 us)",
        *(f"  gap {g.us:8.1f} us after {g.after[:60]!r} before {g.before[:60]!r}" for g in largest),
    ]
    return "\n".join(lines)
