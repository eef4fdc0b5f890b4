"""What the timed run's steps say: where the time went (by phase, and by batch size while
decoding), and the decode step at the largest batch against its roofline bound."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, NamedTuple

from ..history.roofline import RoutedExperts, routed_experts
from .bound import DeviceSpec, decode_step_bound

if TYPE_CHECKING:
    from ..models.config import ModelConfig
    from ..scheduler.record import StepRecord

BATCH_BUCKETS = (16, 64, 128, 192)


class HostTime(NamedTuple):
    """Host milliseconds of a step: launching it, waiting for the device, collecting its tokens."""

    launch_ms: float
    wait_ms: float
    collect_ms: float


class StepTime(NamedTuple):
    """One step of the timed run, as the bench's step callback saw it."""

    end: float  # the run's clock when the step returned (seconds)
    phase: str
    batch_size: int
    kv_tokens: int  # KV tokens the step read, over all its rows
    host: HostTime
    # a step with prompt tokens: its tokens, forward stage and device time (0: a decode step)
    tokens: int = 0
    forward_ms: float = 0.0
    device_ms: float = 0.0
    graph: bool = False
    experts: RoutedExperts | None = None  # an MoE model's, from the step's routing


def step_time(record: StepRecord, end: float) -> StepTime:
    """What the run keeps of a step that returned at `end`: plain numbers, read without
    completing the record (no per-request pass) unless it has prompt tokens."""
    ms = record.stage_ms()
    collect_ms = ms["collect"] + ms["record"]
    host = HostTime(sum(ms.values()) - collect_ms, record.wait_ms, collect_ms)
    if record.batch is not None:  # each request's KV as launched, its new token's too
        kv_tokens = int(record.batch.ledger[2].sum())
    else:
        kv_tokens = sum(r.cached_len for r in record.rows)
    experts = routed_experts(_routing(record))
    step = StepTime(end, record.phase, record.size, kv_tokens, host, experts=experts)
    if record.phase == "decode":
        return step
    record.complete()  # (collected: its device time needs no wait)
    return step._replace(
        tokens=record.num_tokens,
        forward_ms=ms["forward"],
        device_ms=record.device_ms,
        graph=record.cuda_graph,
    )


def _routing(record: StepRecord):
    """The step's expert counts (None: a dense model's), from its launch while it is live."""
    launch = record.launch
    if launch is not None and launch.routing is not None:
        return launch.host_routing()
    return record.routing


class PromptSteps(NamedTuple):
    """The steps with prompt tokens: how many, and medians of tokens, forward stage and device
    time (on a GPU, a forward stage about as long as the device time means launches set it)."""

    steps: int
    tokens: float
    forward_ms: float
    device_ms: float
    graphs: int = 0  # of them replayed a CUDA graph


def prompt_steps(steps: list[StepTime]) -> PromptSteps:
    nan = float("nan")
    prompt = [s for s in steps if s.phase != "decode"]
    if not prompt:
        return PromptSteps(0, nan, nan, nan)
    return PromptSteps(
        len(prompt),
        statistics.median(s.tokens for s in prompt),
        statistics.median(s.forward_ms for s in prompt),
        statistics.median(s.device_ms for s in prompt),
        sum(s.graph for s in prompt),
    )


class TimeSplit(NamedTuple):
    """Seconds of each step, by its phase; and of each decode step, by its batch-size bucket;
    and those the run waited with nothing to step, for a request to arrive."""

    by_phase: dict[str, list[float]]
    by_batch: dict[str, list[float]]
    idle: float = 0.0


def split_time(
    steps: list[StepTime], start: float, idle: list[tuple[float, float]] = ()
) -> TimeSplit:
    """Seconds between consecutive step ends, by the later step's phase, and decode's by batch;
    the `idle` spans (from, to) in between are not a step's."""
    by_phase: dict[str, list[float]] = {}
    by_batch: dict[str, list[float]] = {}
    spans, waited = sorted(idle), 0.0
    for prev_end, step in zip([start] + [s.end for s in steps], steps):
        seconds = step.end - prev_end
        while spans and spans[0][1] <= step.end:  # waits before this step (after the last)
            span = spans.pop(0)
            seconds -= span[1] - span[0]
            waited += span[1] - span[0]
        by_phase.setdefault(step.phase, []).append(seconds)
        if step.phase == "decode":
            by_batch.setdefault(_bucket(step.batch_size), []).append(seconds)
    return TimeSplit(by_phase, by_batch, waited)


def _bucket(batch_size: int) -> str:
    top = f">{BATCH_BUCKETS[-1]}"
    return next((f"<={b}" for b in BATCH_BUCKETS if batch_size <= b), top)


class DecodeStep(NamedTuple):
    """The decode step at the largest batch of the run: medians over the steps of that size."""

    batch_size: int  # 0 when the run had no decode step
    step_ms: float  # between consecutive decode steps of that size; NaN when no two were
    kv_tokens: int
    bound_ms: float  # the roofline's time for such a step; 0 when none
    host: HostTime  # over every decode step of that size; NaN when none
    # an MoE model's experts touched per MoE layer, which the bound reads (NaN: dense, or none)
    experts_touched: float = float("nan")


def decode_step(
    steps: list[StepTime], model_cfg: ModelConfig, spec: DeviceSpec | None
) -> DecodeStep:
    """The decode step at the largest batch, and its bound for `model_cfg` on `spec` (NaN
    without one)."""
    nan = float("nan")
    top = max((s.batch_size for s in steps if s.phase == "decode"), default=0)
    at_top = [s.host for s in steps if s.phase == "decode" and s.batch_size == top]
    if at_top:
        host = HostTime(*(statistics.median(ms) for ms in zip(*at_top)))
    else:
        host = HostTime(nan, nan, nan)
    pairs = [
        (a, b)
        for a, b in zip(steps, steps[1:])
        if a.phase == b.phase == "decode" and a.batch_size == b.batch_size == top
    ]
    if not pairs:
        return DecodeStep(top, nan, 0, 0, host)
    step_ms = statistics.median(b.end - a.end for a, b in pairs) * 1e3
    kv_tokens = int(statistics.median(b.kv_tokens for _, b in pairs))
    experts = median_experts([b.experts for _, b in pairs])
    bound_ms = (
        nan
        if spec is None
        else decode_step_bound(model_cfg, top, kv_tokens, spec, experts=experts) * 1e3
    )
    touched = experts.touched / len(model_cfg.moe_layers) if experts else float("nan")
    return DecodeStep(top, step_ms, kv_tokens, bound_ms, host, touched)


def median_experts(steps: list[RoutedExperts | None]) -> RoutedExperts | None:
    """The steps' median experts touched and routed (None: a dense model's steps)."""
    known = [e for e in steps if e is not None]
    if not known:
        return None
    return RoutedExperts(*(statistics.median(v) for v in zip(*known)))
