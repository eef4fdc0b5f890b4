"""`bench --profile`: decode steps of a full batch, profiled by the engine's own probe
(record="full", a profile window of those steps): the busiest kernels (on a CPU, operators), the
device time by kernel family (`history.families`) and where the device sat idle (`timing`)."""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from ..core import SamplingParams
from ..history.families import breakdown_table, leaf_events
from ..history.trace import export_trace
from ..llm import LLM
from .workload import prompt_vocab, random_workload

WARM_STEPS = 3  # profiled first and left out: a session's first steps carry its start


class DecodeProfile(NamedTuple):
    """The profiled decode steps of one batch size, as the run's tables hold them."""

    batch_size: int
    steps: pd.DataFrame  # their rows of the steps table
    events: pd.DataFrame  # their profiler events, rank 0's
    families: pd.DataFrame  # their rows of `breakdown_table`

    @property
    def count(self) -> int:
        return len(self.steps)

    def family_ms(self) -> dict[str, float]:
        """Device ms per step by kernel family ("between kernels" and "idle" among them)."""
        if not self.count:
            return {}
        return (self.families.groupby("family").ms.sum() / self.count).to_dict()

    def launches(self) -> float:
        """Kernels (on a CPU, leaf operators) per step."""
        return len(leaf_events(self.events)) / self.count if self.count else float("nan")

    def kernels(self, top: int) -> list[tuple[str, float, float]]:
        """The `top` kernels (on a CPU, operators) by the time they count (`exclusive_us`):
        (name, ms, launches) per step."""
        leaf = leaf_events(self.events)
        if leaf.empty or not self.count:
            return []
        by_name = leaf.groupby("name").exclusive_us.agg(["sum", "size"])
        by_name = by_name.sort_values("sum", ascending=False).head(top)
        n = self.count
        return [(name, s / 1e3 / n, k / n) for name, (s, k) in by_name.iterrows()]

    def idle_lines(self, largest: int = 5) -> list[str]:
        """The device's busy share of the steps' span and its idle time per step (`timing`'s
        definitions); on a GPU, the gaps between a step's kernels: the largest, each with the
        kernels it lay between, and the gaps per step by the kernel they follow (a gap that
        recurs in every layer is small alone and large in sum)."""
        steps = self.steps
        span, device = steps.span_ms.sum(), steps.device_ms.sum()
        lines = [
            f"device busy {100 * device / span:.1f}% of {span:.2f} ms over {self.count} "
            f"steps; idle {steps.idle_ms.mean():.3f} ms per step"
        ]
        gaps = kernel_gaps(self.events)
        if gaps is None:
            return lines
        per_step = self.count
        gap_ms = gaps.us.sum() / per_step / 1e3
        line = (
            f"gaps between kernels {gap_ms:.3f} ms per step, {len(gaps)} gaps "
            f"({int((gaps.us > 20).sum())} over 20 us)"
        )
        if not self.families.empty:  # the family is the step's device time less its kernels'
            between = self.family_ms().get("between kernels", 0.0)
            rest = between - gap_ms
            line += f'; of the family\'s {between:.3f} ms "between kernels", ' + (
                f"{rest:.3f} lie before the step's first kernel or after its last"
                if rest >= 0
                else f"none: the step's device time (its CUDA events) is {-rest:.3f} ms short "
                "of its kernels' span"
            )
        lines.append(line)
        for g in gaps.nlargest(largest, "us").itertuples():
            lines.append(f"  gap {g.us:8.1f} us after {g.after[:60]!r} before {g.before[:60]!r}")
        by_kernel = gaps.groupby("after").us.agg(["sum", "size"]).nlargest(largest, "sum")
        if len(by_kernel):
            lines.append("gaps by the kernel they follow, us and gaps per step:")
        for name, (total, n) in by_kernel.iterrows():
            lines.append(
                f"  {total / per_step:8.1f} us in {n / per_step:5.1f} gaps after {name[:60]!r}"
            )
        return lines


def kernel_gaps(events: pd.DataFrame) -> pd.DataFrame | None:
    """The gaps between the kernels of each step (None without kernels): `us`, from where the
    kernels before it ended to the next one's start; `after`, the kernel that ended last before
    it (with kernels that overlap, as under PDL, not always the one launched last); `before`."""
    kernels = events[events.category == "kernel"].sort_values(["step", "start_us"])
    if kernels.empty:
        return None
    # NOTE: within each step: the profiled steps need not follow one another, and the time
    # from one step's kernels to the next's is the host's ("idle"), not between kernels
    step, name = kernels.step, kernels.name
    end = kernels.start_us + kernels.duration_us
    reach = end.groupby(step).cummax()
    last = name.where(end >= reach).groupby(step).ffill()  # whose end `reach` is
    start, step = kernels.start_us.to_numpy(), step.to_numpy()
    gaps = pd.DataFrame(
        {
            "us": start[1:] - reach.to_numpy()[:-1],
            "after": last.to_numpy()[:-1],
            "before": name.to_numpy()[1:],
        }
    )
    return gaps[(gaps.us > 0) & (step[1:] == step[:-1])]


def profile_decode_steps(
    llm: LLM,
    batch_size: int,
    steps: int,
    prompt_len: tuple[int, int],
    seed: int,
    temperature: float = 0.0,
    trace: str | None = None,
) -> DecodeProfile:
    """`steps` decode steps of `batch_size` requests, profiled through the engine's probe: the
    engine is reconfigured to record="full" with a window of exactly such steps, a workload runs
    to its end, and its record level and window are restored. Needs an idle engine. `trace`: a
    Chrome trace JSON of that run, written there."""
    probe = llm.scheduler.probe
    record, window = probe.record, probe.window
    expression = f"phase == 'decode' and batch_size == {batch_size}"
    llm.reconfigure(record="full", profile_steps=expression, max_profiled_steps=WARM_STEPS + steps)
    try:
        # enough tokens that every request decodes in the full batch for all the steps, however
        # many steps its prompts took
        prefill_steps = -(-batch_size * prompt_len[1] // llm.config.max_extend_tokens)
        max_tokens = WARM_STEPS + steps + prefill_steps + 2
        work = random_workload(
            batch_size, prompt_len, (max_tokens, max_tokens), seed, prompt_vocab(llm)
        )
        sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True)
        llm.generate(work.prompts, sampling)
        history = llm.history
        table = history.steps
        chosen = table[table.profiled].step.to_numpy()[WARM_STEPS:]
        events = history.events
        events = events[events.step.isin(chosen) & (events["rank"] == 0)]
        families = breakdown_table(history)
        if trace is not None:
            export_trace(table, history.events, trace, llm.run_meta())
        return DecodeProfile(
            batch_size,
            table[table.step.isin(chosen)],
            events,
            families[families.step.isin(chosen)],
        )
    finally:
        llm.scheduler.abort_all()
        llm.reconfigure(record=record, profile_steps=window, max_profiled_steps=window.max_steps)


def profile_text(profile: DecodeProfile, top: int = 25) -> str:
    """What `bench --profile` prints of a `DecodeProfile`."""
    if not profile.count:
        return f"no decode step of {profile.batch_size} requests was profiled"
    unit = "kernels" if (profile.events.category == "kernel").any() else "operators"
    lines = [
        f"{profile.count} decode steps of {profile.batch_size} requests, profiled "
        f"(record=full), {profile.launches():.0f} {unit} a step; the busiest {unit}, ms and "
        "launches per step"
    ]
    lines += [f"  {ms:8.3f} ms {n:6.1f}x  {name[:90]}" for name, ms, n in profile.kernels(top)]
    parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(profile.family_ms().items()))
    lines.append(f"ms per decode step by family: {parts}")
    lines += profile.idle_lines()
    return "\n".join(lines)
