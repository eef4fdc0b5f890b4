"""What a comparison of runs says, in sentences from their records: per figure the best and worst
setting where they differ by more than their noise (`viz.noise`), else a tie, and why."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import NamedTuple

import pandas as pd

from ..timing import DEVICE_MEANING
from .causes import Causes, counted, describe, mean_causes, number, queued_phrase, run_causes
from .common import check_recorded, checked_runs
from .compare import compare_table
from .noise import repeats_of, same_setting_groups


class Summary(list):
    """Sentences (a list of str): printed one a line, shown as a list in a notebook."""

    def __str__(self) -> str:
        return "\n".join(self)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(sentence)}</li>" for sentence in self)
        return f'<ul style="margin:4px 0;padding-left:20px">{items}</ul>'


class Verdict(NamedTuple):
    """One figure across the settings: the best and the worst, or a tie (`best` empty)."""

    best: list[str]  # the best setting, and those within noise of it (empty: a tie)
    worst: list[str]  # the worst, and those within noise of it
    between: list[str]  # within noise of the best and of the worst alike
    noise: float  # the largest spread of the settings compared (NaN: not known)


def compare_summary(runs: Mapping[str, object]) -> Summary:
    """Sentences from the runs' records: for throughput, TTFT, ITL and TPOT, the best and worst
    setting where they differ by more than their noise, and why; else a tie. With one run, the
    run described."""
    runs = checked_runs(runs, empty=True)
    for label, value in runs.items():
        for history in repeats_of(value):
            check_recorded(history, f"run {label!r}")
    firsts = {label: repeats_of(value)[0] for label, value in runs.items()}
    # (over all of a setting's runs, as the table's figures are)
    causes = {
        label: mean_causes([run_causes(run) for run in repeats_of(value)])
        for label, value in runs.items()
    }
    if len(runs) < 2:
        return Summary(describe(label, c) for label, c in causes.items())
    table = compare_table(runs, full=True)
    repeats = {label: len(repeats_of(value)) for label, value in runs.items()}
    same = same_setting_groups(firsts)
    figures = (
        ("output tokens/s", "Throughput", True, _throughput_why),
        ("p50 TTFT (ms)", "Time to first token", False, _ttft_why),
        ("p50 ITL (ms)", "Inter-token latency", False, _itl_why),
        ("p50 TPOT (ms)", "Time per output token", False, _itl_why),
    )
    sentences = [
        _noise_sentence(repeats, same),
        *(_figure_sentence(table, causes, *figure, same) for figure in figures),
        _same_schedule(firsts),
        _host_sentence(table, causes),
    ]
    return Summary(sentence for sentence in sentences if sentence)


def verdict(
    values: pd.Series, spreads: pd.Series, higher: bool, same: list[list[str]] = ()
) -> Verdict | None:
    """The best and worst of `values` where they differ by more than their spreads together,
    each with the settings within noise of it. Runs of one setting (`same`: groups of labels)
    are never apart. None: fewer than two values."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    if len(values) < 2:
        return None
    spreads = pd.to_numeric(spreads.reindex(values.index), errors="coerce")
    noise = float(spreads.max()) if spreads.notna().any() else math.nan
    best = values.idxmax() if higher else values.idxmin()
    worst = values.idxmin() if higher else values.idxmax()

    group = {label: i for i, labels in enumerate(same) for label in labels}

    def apart(a: str, b: str) -> bool:
        if a in group and group.get(a) == group.get(b):
            return False
        together = spreads[a] + spreads[b]
        return not math.isnan(together) and abs(values[a] - values[b]) > together

    if not apart(best, worst):
        return Verdict([], [], [], noise)
    order = values.sort_values(ascending=not higher).index
    both = [x for x in order if not apart(best, x) and not apart(worst, x)]
    return Verdict(
        [x for x in order if not apart(best, x) and x not in both],
        [x for x in reversed(order) if not apart(worst, x) and x not in both],
        both,
        noise,
    )


def _figure_sentence(table, causes, column: str, title: str, higher: bool, why, same) -> str:
    if column not in table:
        return ""
    judged = _verdict_of(table, column, higher, same)
    if judged is None:
        return ""
    unit = f" {column}" if column.endswith("/s") else " ms"
    tail, parted = _tail_clause(table, column, higher, same)
    if not judged.best:
        what = "" if unit.endswith("/s") else f"{column.split(' ')[0]} "
        if math.isnan(judged.noise):  # no verdict either way
            said = f"{title} is not judged ({what}{_range(table[column], unit)}; noise not known)"
        else:
            spans = f"{what}{_range(table[column], unit)}; noise up to ± {_value(judged.noise)}"
            said = f"{title} ties within noise ({spans}{unit})"
        # the records of the settings the tail parts, where it does; else the medians' ends
        ends = (parted.best[0], parted.worst[0]) if parted else _extremes(table[column], higher)
        differs = why(causes, *ends)
        return said + tail + (f"; what differs in the records: {differs}." if differs else ".")
    said = f"{title} is {_ends(table, column, judged, higher)}"
    if judged.between:
        verb = "is" if len(judged.between) == 1 else "are"
        said += f"; {_names(judged.between)} {verb} within noise of both"
    differs = why(causes, judged.best[0], judged.worst[0])
    return said + tail + (f". From the records: {differs}." if differs else ".")


def _verdict_of(table, column: str, higher: bool, same) -> Verdict | None:
    spreads = table.get(f"{column} ±", pd.Series(dtype=float))
    return verdict(table[column], spreads, higher, same)


def _ends(table, column: str, judged: Verdict, higher: bool) -> str:
    """ "highest with a (1,002 ± 31 output tokens/s) and lowest with b (...) and c (...)": each
    setting named with its own figure."""
    higher_word, lower_word = ("highest", "lowest") if higher else ("lowest", "highest")

    def named(labels: list[str]) -> str:
        return _names([f"{label} ({_figure(table, label, column)})" for label in labels])

    return f"{higher_word} with {named(judged.best)} and {lower_word} with {named(judged.worst)}"


def _tail_clause(table, column: str, higher: bool, same) -> tuple[str, Verdict | None]:
    """For a p50 latency, what its p99 says where the table has it (the tail can part settings
    whose medians tie, or tie where the medians part), and p99's verdict where it parts them."""
    tail = column.replace("p50 ", "p99 ", 1)
    if tail == column or tail not in table:
        return "", None
    judged = _verdict_of(table, tail, higher, same)
    if judged is None:
        return "", None
    if judged.best:
        return f"; at p99 it is {_ends(table, tail, judged, higher)}", judged
    if math.isnan(judged.noise):
        return f"; at p99 {_range(table[tail], ' ms')}", None
    noise = f"; noise up to ± {_value(judged.noise)} ms"
    return f"; at p99 within noise of each other ({_range(table[tail], ' ms')}{noise})", None


def _extremes(values: pd.Series, higher: bool) -> tuple[str, str]:
    numeric = pd.to_numeric(values, errors="coerce")
    return (numeric.idxmax(), numeric.idxmin()) if higher else (numeric.idxmin(), numeric.idxmax())


def _throughput_why(causes: dict[str, Causes], a: str, b: str) -> str:
    x, y = causes[a], causes[b]
    parts = []
    if x.steps != y.steps or _differ(x.mean_step_ms, y.mean_step_ms, 0.05):
        parts.append(
            f"{a} took {counted(x.steps, 'step')} of {x.mean_step_ms:.1f} ms on average, "
            f"{b} {counted(y.steps, 'step')} of {y.mean_step_ms:.1f} ms"
        )
    return "; ".join(parts + _host_bound_why(x, y, a, b))


def _host_bound_why(x: Causes, y: Causes, a: str, b: str) -> list[str]:
    if x.host_bound is None or y.host_bound is None or x.host_bound == y.host_bound:
        return []
    return [
        f"{number(x.host_bound)} of {a}'s steps were host-bound, {number(y.host_bound)} of {b}'s "
        "(the host's own work longer than the device's: there the host set the pace)"
    ]


def _ttft_why(causes: dict[str, Causes], a: str, b: str) -> str:
    """What differs between two runs in how their prompts were scheduled."""
    x, y = causes[a], causes[b]
    parts = []
    if _differ(x.steps_per_prompt, y.steps_per_prompt):
        parts.append(f"{_prompts_phrase(a, x)}, {_prompts_phrase(b, y)}")
    if _differ(x.mean_ttft_steps, y.mean_ttft_steps):
        parts.append(
            f"a first token took {x.mean_ttft_steps:.2f} steps on average with {a} (its arrival "
            f"step to its own, both counted), {y.mean_ttft_steps:.2f} with {b}"
        )
    if _differ(x.queued_s, y.queued_s, 0.1):
        parts.append(f"{a}'s requests {queued_phrase(x)}; {b}'s {queued_phrase(y)}")
    return "; ".join(parts + _host_bound_why(x, y, a, b))


def _prompts_phrase(label: str, c: Causes) -> str:
    """ "chunk 16 split 3 of 4 prompts into chunks (2.25 steps a prompt on average)"."""
    if not c.chunked:
        return f"{label} computed every prompt in one step"
    return (
        f"{label} split {number(c.chunked)} of {counted(c.prompts, 'prompt')} into chunks "
        f"({c.steps_per_prompt:.2f} steps a prompt on average)"
    )


def _itl_why(causes: dict[str, Causes], a: str, b: str) -> str:
    """What differs between two runs in the steps that ran beside the decodes."""
    x, y = causes[a], causes[b]
    parts = []
    if x.prompt_steps != y.prompt_steps or x.paused_steps != y.paused_steps:
        said = (
            f"{a} ran {counted(x.prompt_steps, 'step')} with prompt tokens (up to "
            f"{x.prompt_tokens_max:,} a step), {b} {number(y.prompt_steps)} (up to "
            f"{y.prompt_tokens_max:,})"
        )
        if x.paused_steps or y.paused_steps:
            said += (
                f"; prefill steps paused the running decodes {counted(x.paused_steps, 'time')} "
                f"with {a}, {number(y.paused_steps)} with {b}"
            )
        parts.append(said)
    if _differ(x.mean_step_ms, y.mean_step_ms, 0.05):
        parts.append(
            f"a step took {x.mean_step_ms:.1f} ms on average with {a}, "
            f"{y.mean_step_ms:.1f} with {b}"
        )
    return "; ".join(parts + _host_bound_why(x, y, a, b))


def _noise_sentence(repeats: dict[str, int], same: list[list[str]]) -> str:
    counts = set(repeats.values())
    if counts == {1}:
        said = (
            "Each setting ran once: a figure's noise is a bootstrap over its run's requests "
            "(latencies) or steps (throughput), at least the machine's jitter between steps of "
            "one shape (not known where no shape ran twice); repeats=N in compare measures it "
            "over runs"
        )
    else:
        n = f"{min(counts)} times" if len(counts) == 1 else f"{min(counts)} to {max(counts)} times"
        n = "twice" if n == "2 times" else n
        said = (
            f"Each setting ran {n}, interleaved with the others: a figure is the mean of "
            "its runs, its noise the larger of their range and a bootstrap over each run"
        )
    for labels in same:
        said += f"; {_names(labels)} are one setting: how far apart they are is noise"
    return said + "."


def _same_schedule(firsts: Mapping[str, object]) -> str:
    """Whether every run took the same steps: then their times differ by noise only (a twin's
    by its step costs)."""
    shapes = {
        label: tuple(
            map(tuple, h.steps[["phase", "batch_size", "num_tokens"]].astype(str).to_numpy())
        )
        for label, h in firsts.items()
    }
    if len(set(shapes.values())) > 1:
        return ""
    said = (
        "Every run took the same steps (the same batches, step for step): the settings do not "
        "change this workload's schedule, so their times differ by "
    )
    simulated = [bool(getattr(h, "meta", {}).get("simulated")) for h in firsts.values()]
    if all(simulated):  # a twin's clock has no noise: its times are its step costs'
        return said + "the twins' step costs only."
    if any(simulated):
        return said + "noise and by how far the twin's step costs are from the measured steps."
    return said + "noise only."


def _host_sentence(table: pd.DataFrame, causes: dict[str, Causes]) -> str:
    """Each setting's host-bound steps, as the table counts them (a mean over repeats)."""
    if "host-bound steps" not in table or table["host-bound steps"].isna().all():
        return ""
    on_cpu = any(c.on_cpu for c in causes.values())
    each = ", ".join(
        f"{label} {number(row['host-bound steps'])} of {number(row['steps'])}"
        for label, row in table.iterrows()
        if pd.notna(row["host-bound steps"])
    )
    where = f"; {DEVICE_MEANING[True]}" if on_cpu else ""
    return f"Host-bound steps (the host's own work longer than the device's{where}): {each}."


def _differ(a: float, b: float, relative: float = 0.0) -> bool:
    if math.isnan(a) or math.isnan(b):
        return False
    return abs(a - b) > max(1e-9, relative * max(abs(a), abs(b)))


def _figure(table: pd.DataFrame, run: str, column: str) -> str:
    """ "p50 134 ± 8.2 ms", or "1,002 ± 31 output tokens/s"."""
    value = table.loc[run, column]
    spread = table.loc[run, f"{column} ±"] if f"{column} ±" in table else math.nan
    noise = "" if pd.isna(spread) else f" ± {_value(spread)}"
    if column.endswith("/s"):
        return f"{_value(value)}{noise} {column}"
    return f"{column.split(' ')[0]} {_value(value)}{noise} ms"


def _value(value: float) -> str:
    value = float(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _range(values: pd.Series, unit: str) -> str:
    """ "80.3 to 97.8 ms", or "118 ms in every setting" where both ends read the same."""
    numeric = pd.to_numeric(values, errors="coerce")
    low, high = _value(numeric.min()), _value(numeric.max())
    return f"{low}{unit} in every setting" if low == high else f"{low} to {high}{unit}"


def _names(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]
