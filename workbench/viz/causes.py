"""Where a run's time went, from its records: queue time by refusal reason, the prompt steps and
how busy the device was in them, host-bound steps."""

from __future__ import annotations

import math
from typing import NamedTuple

import pandas as pd

from ..timing import add_timing_columns, device_on_host, run_timing

# a refusal reason (`core.admission`), as a sentence says what the request waited for
WAITED_FOR = {
    "no_token_budget": "for the token budget",
    "no_slot": "for a request slot",
    "kv_full": "for KV cache space",
    "kv_full_after_lock": "for KV cache space after locking its prefix",
    "queued_behind": "behind a refused request",
    "wait_for_prefix": "for a shared prefix to be computed",
    "decode_first": "for the running decodes",
}


class Causes(NamedTuple):
    """A run's figures of where its time went, and of how its prompts were scheduled."""

    steps: int
    mean_step_ms: float
    queued_ms: dict[str, float]  # request-ms refused, by reason, largest first
    prompt_steps: int
    paused_steps: int  # of those, prefill steps while requests were running: decodes paused
    prompt_tokens_max: int
    prompt_device_share: float  # NaN: no prompt steps
    device_share: float
    host_bound: int | None  # None: not recorded
    on_cpu: bool  # the forward ran on the host: its time is the device's, not host work
    steps_per_prompt: float
    chunked: int  # requests whose prompt took more than one step
    prompts: int
    mean_ttft_steps: float  # the step of the first token included

    @property
    def queued_s(self) -> float:
        return sum(self.queued_ms.values()) / 1e3


def run_causes(history) -> Causes:
    """The figures of `Causes`; a request refused at a step waited that step's wall time for the
    refusal's reason."""
    steps = history.steps
    on_cpu = device_on_host(history)
    timing = run_timing(steps, on_cpu)
    if "span_ms" not in steps:
        steps = add_timing_columns(steps.copy(), on_cpu)
    prompt = steps[(steps.prefill_tokens + steps.chunk_tokens) > 0]
    # `running` counts after a step: the requests running when a step began, the step's before it
    running_before = steps.sort_values("step").running.shift(1, fill_value=0).reindex(steps.index)
    per_prompt = _steps_per_prompt(history.ledger)
    requests = history.requests
    ttft_steps = requests.first_token_step - requests.arrival_step + 1
    return Causes(
        steps=len(steps),
        mean_step_ms=float(steps.wall_ms.mean()) if len(steps) else math.nan,
        queued_ms=_queued_ms(history),
        prompt_steps=len(prompt),
        # a prefill step decodes none of the requests running before it
        paused_steps=int(((prompt.phase == "prefill") & (running_before[prompt.index] > 0)).sum()),
        prompt_tokens_max=int((prompt.prefill_tokens + prompt.chunk_tokens).max() or 0)
        if len(prompt)
        else 0,
        prompt_device_share=_share(prompt),
        device_share=timing.device_busy_pct / 100,
        host_bound=timing.host_bound,
        on_cpu=on_cpu,
        steps_per_prompt=float(per_prompt.mean()) if len(per_prompt) else math.nan,
        chunked=int((per_prompt > 1).sum()),
        prompts=len(per_prompt),
        mean_ttft_steps=float(ttft_steps.mean()) if ttft_steps.notna().any() else math.nan,
    )


def mean_causes(runs: list[Causes]) -> Causes:
    """The runs of one setting as one: each figure the mean of its runs' (as `compare_table`'s
    figures are), the largest prompt step the largest of any; a count may then be fractional."""
    if len(runs) == 1:
        return runs[0]

    def mean(values) -> float:
        values = [float(v) for v in values]
        known = [v for v in values if not math.isnan(v)]
        return sum(known) / len(known) if known else math.nan

    reasons = {reason for c in runs for reason in c.queued_ms}
    queued = {r: mean(c.queued_ms.get(r, 0.0) for c in runs) for r in reasons}
    host_bound = [c.host_bound for c in runs]
    fields = {
        name: mean(getattr(c, name) for c in runs)
        for name in Causes._fields
        if name not in ("queued_ms", "prompt_tokens_max", "host_bound", "on_cpu")
    }
    return Causes(
        **fields,
        queued_ms=dict(sorted(queued.items(), key=lambda item: -item[1])),
        prompt_tokens_max=max(c.prompt_tokens_max for c in runs),
        host_bound=None if None in host_bound else mean(host_bound),
        on_cpu=runs[0].on_cpu,
    )


def number(n: float) -> str:
    """A count as a sentence says it: "16", or "16.5" for the mean of runs."""
    n = float(n)
    return f"{n:,.0f}" if n.is_integer() else f"{n:,.1f}"


def _steps_per_prompt(ledger: pd.DataFrame) -> pd.Series:
    """Per request, the steps that computed part of its prompt (its chunks and "prefill")."""
    if "kind" not in ledger:  # a run saved with its tokens alone (a slimmed run)
        return pd.Series(dtype=float)
    prompt = ledger[ledger.kind.isin(("chunk", "prefill"))]
    return prompt.groupby("uid").step.nunique()


def _queued_ms(history) -> dict[str, float]:
    admissions = history.admissions
    refused = admissions[~admissions.admitted.fillna(False).astype(bool)]
    refused = refused.drop_duplicates(["step", "uid"])  # one reason a step for each request
    wall_ms = history.steps.set_index("step").wall_ms
    by_reason = refused.step.map(wall_ms).groupby(refused.reason.to_numpy()).sum()
    return {str(r): float(ms) for r, ms in by_reason.sort_values(ascending=False).items()}


def _share(steps: pd.DataFrame) -> float:
    span_ms = steps.span_ms.sum()
    return float(steps.device_ms.sum() / span_ms) if span_ms > 0 else math.nan


def queued_phrase(causes: Causes, reasons: int = 2) -> str:
    """ "queued 9.1 s in all, 8.0 s for the token budget (no_token_budget), ...": top `reasons`."""
    if not causes.queued_ms:
        return "never waited in the queue"
    parts = [
        f"{_s(ms / 1e3)} {WAITED_FOR.get(reason, 'for ' + reason)} ({reason})"
        for reason, ms in list(causes.queued_ms.items())[:reasons]
    ]
    return f"queued {_s(causes.queued_s)} in all, " + ", ".join(parts)


def prompt_phrase(causes: Causes) -> str:
    """ "91 steps with prompt tokens (up to 256 a step; ...), the device busy 31% of their time"."""
    if not causes.prompt_steps:
        return "no step with prompt tokens"
    paused = (
        f"; {number(causes.paused_steps)} paused the running decodes" if causes.paused_steps else ""
    )
    said = (
        f"{counted(causes.prompt_steps, 'step')} with prompt tokens "
        f"(up to {causes.prompt_tokens_max:,} a step{paused})"
    )
    if math.isnan(causes.prompt_device_share):
        return said
    return f"{said}, the {_device(causes)} busy {causes.prompt_device_share:.0%} of their time"


def host_phrase(causes: Causes) -> str:
    """ "80 of 110 steps host-bound" (or that the run recorded no host times)."""
    if causes.host_bound is None:
        return "no host times recorded"
    return f"{number(causes.host_bound)} of {counted(causes.steps, 'step')} host-bound"


def describe(label: str, causes: Causes) -> str:
    """One run in a sentence: its steps, their prompt work, the host, the queue."""
    return (
        f"{label}: {counted(causes.steps, 'step')} of {causes.mean_step_ms:.1f} ms on average, "
        f"the {_device(causes)} busy {causes.device_share:.0%} of the time; "
        f"{prompt_phrase(causes)}; {host_phrase(causes)}; its requests {queued_phrase(causes)}."
    )


def _device(causes: Causes) -> str:
    return "forward (on the CPU)" if causes.on_cpu else "device"


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"


def counted(n: float, noun: str) -> str:
    """ "1 step", "12 steps", "2.5 steps" (the mean of runs)."""
    return f"{number(n)} {noun}" if n == 1 else f"{number(n)} {noun}s"
