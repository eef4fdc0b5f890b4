"""What a comparison of runs says, in sentences computed from their records: the best and the
worst run for each figure a user came for, and why (`viz.causes`). Shown under the table in the
notebooks; `compare_summary(runs)` for any runs."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from .causes import Causes, describe, prompt_phrase, queued_phrase, run_causes
from .compare import compare_table


def compare_summary(runs: Mapping[str, object]) -> list[str]:
    """Plain sentences from the runs' records: which run is best and which worst for
    throughput, time to first token, inter-token latency and time per output token, each with
    its cause (the steps and their length; the time queued by refusal reason; the steps with
    prompt tokens and the device's occupancy in them); then each run's host-bound steps. A
    figure within 5% in every run is said to be the same. With one run, the run described."""
    causes = {label: run_causes(history) for label, history in runs.items()}
    if len(runs) < 2:
        return [describe(label, c) for label, c in causes.items()]
    table = compare_table(runs, full=True)
    sentences = [
        _throughput_sentence(table, causes),
        _latency_sentence(table, causes, "TTFT", "Time to first token", _queued),
        _latency_sentence(table, causes, "ITL", "Inter-token latency", _prompt_steps),
        _latency_sentence(table, causes, "TPOT", "Time per output token", None),
        _host_sentence(causes),
    ]
    return [sentence for sentence in sentences if sentence]


def _ranked(table: pd.DataFrame, column: str, higher: bool) -> tuple[str, str] | str | None:
    """(best, worst) run by `column`; "same" when they are within 5%; None with fewer than two
    runs that have the figure."""
    values = pd.to_numeric(table[column], errors="coerce").dropna()
    if len(values) < 2:
        return None
    best, worst = (
        (values.idxmax(), values.idxmin()) if higher else (values.idxmin(), values.idxmax())
    )
    if abs(values[worst] - values[best]) <= 0.05 * abs(values[best]):
        return "same"
    return best, worst


def _throughput_sentence(table: pd.DataFrame, causes: dict[str, Causes]) -> str | None:
    column = "output tokens/s"
    ranked = _ranked(table, column, higher=True)
    values = table[column]
    if ranked is None:
        return None
    if ranked == "same":
        return f"Throughput is the same within 5% in every run ({_range(values, ' tokens/s')})."
    best, worst = ranked
    b, w = causes[best], causes[worst]
    return (
        f"Throughput is highest with {best} ({values[best]:,.0f} output tokens/s) and lowest "
        f"with {worst} ({values[worst]:,.0f}): {best} took {b.steps:,} steps of "
        f"{b.mean_step_ms:.1f} ms on average, {worst} {w.steps:,} of {w.mean_step_ms:.1f} ms."
    )


def _latency_sentence(table, causes: dict[str, Causes], name: str, title: str, cause) -> str:
    """`title` at p50 and p99: the lowest and the highest run (by p50), and `cause(causes)` of
    each of the two."""
    p50, p99 = f"p50 {name} (ms)", f"p99 {name} (ms)"
    ranked = _ranked(table, p50, higher=False)
    if ranked is None:
        return ""
    if ranked == "same":
        return f"{title} is the same within 5% in every run (p50 {_range(table[p50], ' ms')})."
    best, worst = ranked
    said = f"{title} is lowest with {best} ({_p50_p99(table, best, p50, p99)}) and highest "
    said += f"with {worst} ({_p50_p99(table, worst, p50, p99)})"
    best99 = _ranked(table, p99, higher=False)
    if isinstance(best99, tuple) and best99[0] != best:
        said += f"; at p99 {best99[0]} is lowest ({_ms(table.loc[best99[0], p99])})"
    if cause is not None:
        said += f". {worst} {cause(causes[worst])}; {best} {cause(causes[best])}"
    return said + "."


def _queued(causes: Causes) -> str:
    return "had its requests " + queued_phrase(causes)


def _prompt_steps(causes: Causes) -> str:
    return "ran " + prompt_phrase(causes)


def _host_sentence(causes: dict[str, Causes]) -> str:
    known = {label: c for label, c in causes.items() if c.host_bound is not None}
    if not known:
        return ""
    on_cpu = any(c.on_cpu for c in known.values())
    cpu = "; on the CPU the forward counts as the device's" if on_cpu else ""
    each = ", ".join(f"{label} {c.host_bound} of {c.steps}" for label, c in known.items())
    return f"Host-bound steps (the host's own work longer than the device's{cpu}): {each}."


def _p50_p99(table: pd.DataFrame, run: str, p50: str, p99: str) -> str:
    return f"p50 {_ms(table.loc[run, p50])}, p99 {_ms(table.loc[run, p99])}"


def _ms(ms: float) -> str:
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def _range(values: pd.Series, unit: str) -> str:
    return f"{values.min():,.4g} to {values.max():,.4g}{unit}"
