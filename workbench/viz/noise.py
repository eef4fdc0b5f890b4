"""How far a run's figures would move if it ran again: the noise beside `compare_table`'s figures.

A setting's spread is the larger of its repeats' range and a bootstrap of each run (the range of
few repeats can be small by chance). A run's step times are drawn from the steps of its shape in
every repeat of its setting, so repeats whose schedules match step for step give each step the
times the machine gave it in each of them. A bootstrap of one run cannot see the machine, so a
setting run once has at least its `step_jitter`, and runs of one setting under two names set a
floor on spreads.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..history.latency import inter_token_latencies
from ..timing import add_timing_columns, device_on_host

RESAMPLES = 300
PERCENTILES = (50, 90, 95, 99)  # of TTFT, TPOT and ITL (`compare_table(full=True)`)
_RELATIVE_THROUGHPUT = "output tokens/s, relative"
_SEED = 20261205


def repeats_of(value) -> list:
    """The runs of one setting: a history's `repeats` (or the history), or a sequence of them."""
    if isinstance(value, list | tuple):
        if not value:
            raise ValueError("a setting's runs are an empty sequence")
        return list(value)
    return list(getattr(value, "repeats", None) or (value,))


def bootstrap_spreads(history, others: Sequence = ()) -> dict[str, float]:
    """One run's bootstrapped spreads, by `compare_table`'s column names; `others`: the other
    runs of its setting, whose steps its steps' times are drawn from too (`_step_spreads`)."""
    rng = np.random.default_rng(_SEED)
    spreads = {}
    r = history.requests
    ttft_ms = (r.ttft_s * 1e3).to_numpy(dtype=float)
    tpot_ms = (r.tpot_s * 1e3).to_numpy(dtype=float)
    ttft_steps = (r.first_token_step - r.arrival_step + 1).to_numpy(dtype=float)
    if len(r):
        draws = rng.integers(0, len(r), (RESAMPLES, len(r)))
        ttft, tpot = (
            _percentiles(ttft_ms[draws], PERCENTILES),
            _percentiles(tpot_ms[draws], PERCENTILES),
        )
        for i, q in enumerate(PERCENTILES):
            spreads[f"p{q} TTFT (ms)"] = _half_width(ttft[i])
            spreads[f"p{q} TPOT (ms)"] = _half_width(tpot[i])
        spreads["mean TTFT (steps)"] = _half_width(_mean(ttft_steps[draws]))
        spreads["p90 TTFT (steps)"] = _half_width(_percentiles(ttft_steps[draws], (90,))[0])
        spreads.update(_itl_spreads(history, r.uid.to_numpy(), draws))
    spreads.update(_step_spreads(history, rng, others))
    return spreads


# the figures made of time (not counts of steps): their spread is at least the step jitter's
TIMED = (
    "output tokens/s",
    *(f"p{q} {name} (ms)" for q in PERCENTILES for name in ("TTFT", "TPOT", "ITL")),
    "mean step wall (ms)",
    "mean step device (ms)",
    "mean step host (ms)",
)


def step_jitter(history) -> float:
    """The 90th percentile of |work / its shape's median work - 1| (`_work_ms`, `_shape`) over the
    steps whose shape ran more than once (NaN: none did)."""
    steps = _timed_steps(history)
    work = pd.Series(_work_ms(steps), index=steps.index)
    shape = work.groupby(_shape(steps))
    median, count = shape.transform("median"), shape.transform("size")
    repeated = (count > 1) & (median > 0)
    if not repeated.any():
        return float("nan")
    deviation = (work[repeated] / median[repeated] - 1).abs()
    return float(deviation.quantile(0.9))


def _itl_spreads(history, uids: np.ndarray, draws: np.ndarray) -> dict[str, float]:
    """ITL's percentiles over the gaps of the requests drawn (each brings all its gaps)."""
    itl_ms = inter_token_latencies(history.steps, history.ledger) * 1e3
    by_uid = {uid: gaps.to_numpy(dtype=float) for uid, gaps in itl_ms.groupby(level=0)}
    gaps = [by_uid.get(uid, np.zeros(0)) for uid in uids]
    nothing = np.full(len(PERCENTILES), np.nan)
    values = np.array(
        [  # [RESAMPLES, percentiles]: one sort a resample for all of them
            np.percentile(pooled, PERCENTILES) if len(pooled) else nothing
            for pooled in (np.concatenate([gaps[i] for i in draw]) for draw in draws)
        ]
    )
    return {f"p{q} ITL (ms)": _half_width(values[:, i]) for i, q in enumerate(PERCENTILES)}


def _step_spreads(history, rng: np.random.Generator, others: Sequence = ()) -> dict[str, float]:
    """Step times and throughput, each step's time drawn from the steps of its shape (`_shape`)
    in this run and `others` (its setting's other runs)."""
    if history.steps.empty:
        return {}
    own = _timed_steps(history)
    steps = pd.concat([own, *(_timed_steps(o) for o in others)], ignore_index=True)
    draws = _within_shapes(steps, rng, len(own))
    work = _work_ms(steps)
    drawn = work[draws].sum(axis=1)
    device = steps.device_ms.to_numpy(dtype=float)
    share = np.where(drawn > 0, device[draws].sum(axis=1) / drawn, np.nan)
    own_work = work[: len(own)].sum()
    own_share = float(device[: len(own)].sum() / own_work) if own_work > 0 else float("nan")
    spreads = {
        _RELATIVE_THROUGHPUT: _half_width(np.where(drawn > 0, own_work / drawn, np.nan)),
        # device busy moves as the device's share of the work does
        "device busy (%)": _half_width(share) / own_share * _busy_pct(own),
    }
    for column, name in (
        ("wall_ms", "mean step wall (ms)"),
        ("device_ms", "mean step device (ms)"),
        ("host_ms", "mean step host (ms)"),
    ):
        if column in steps:
            spreads[name] = _half_width(_mean(steps[column].to_numpy(dtype=float)[draws]))
    return spreads


def _timed_steps(history) -> pd.DataFrame:
    steps = history.steps
    if "host_work_ms" not in steps:
        steps = add_timing_columns(steps.copy(), device_on_host(history))
    return steps


def _work_ms(steps: pd.DataFrame) -> np.ndarray:
    # NOTE: not the span: with overlap on the CPU, a step's span holds the next one's forward
    host = steps.host_work_ms.to_numpy(dtype=float)
    return steps.device_ms.to_numpy(dtype=float) + np.nan_to_num(host)


def _busy_pct(steps: pd.DataFrame) -> float:
    span = float(steps.span_ms.sum()) if "span_ms" in steps else 0.0
    return 100 * float(steps.device_ms.sum()) / span if span > 0 else float("nan")


def _within_shapes(steps: pd.DataFrame, rng: np.random.Generator, own: int) -> np.ndarray:
    """[RESAMPLES, own] row indices: each of the first `own` steps replaced by one of its shape
    among all of `steps`, with replacement."""
    draws = np.empty((RESAMPLES, own), dtype=np.int64)
    for members in steps.groupby(_shape(steps)).indices.values():
        mine = members[members < own]
        draws[:, mine] = members[rng.integers(0, len(members), (RESAMPLES, len(mine)))]
    return draws


def _shape(steps: pd.DataFrame) -> list:
    """What makes two steps the same work: phase, requests, tokens, the KV context the decodes
    read (within 9%) and whether the profiler recorded the step (it pays for the profiler)."""
    context = np.round(np.log2(steps.decode_context.to_numpy(dtype=float) + 1) * 8)
    keys = [steps.phase, steps.batch_size, steps.num_tokens, pd.Series(context, index=steps.index)]
    return keys + ([steps.profiled] if "profiled" in steps else [])


def _percentiles(values: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """[len(qs), rows]: each row's percentiles, NaN left out (a request without a TPOT; a row of
    NaN only gives NaN), as `np.nanpercentile` gives them (its "linear" method), from one sort of
    the whole array: `nanpercentile` along an axis that holds NaN goes row by row in Python."""
    ordered = np.sort(values, axis=1)  # NaN last
    count = (~np.isnan(values)).sum(axis=1)
    rows = np.arange(len(values))
    out = np.full((len(qs), len(values)), np.nan)
    some = count > 0
    for i, q in enumerate(qs):
        at = (count[some] - 1) * (q / 100)
        below = np.floor(at).astype(np.int64)
        above = np.minimum(below + 1, count[some] - 1)
        low, high = ordered[rows[some], below], ordered[rows[some], above]
        out[i, some] = _lerp(low, high, at - below)
    return out


def _lerp(low: np.ndarray, high: np.ndarray, t: np.ndarray) -> np.ndarray:
    """numpy's own interpolation between neighbours (from the nearer end: the same last digit)."""
    step = high - low
    return np.where(t >= 0.5, high - step * (1 - t), low + step * t)


def _mean(values: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(values, axis=1)


def _half_width(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    if not len(values):
        return float("nan")
    low, high = np.percentile(values, [2.5, 97.5])
    return float((high - low) / 2)


def run_spreads(history, row: dict, others: Sequence = ()) -> dict[str, float]:
    """One run's spreads by figure: its bootstrap's (its steps drawn among `others`' too: the
    other runs of its setting), and for a run alone (no `others`) at least its step jitter times
    the figure for the timed ones; NaN (not known) for those where no step's shape ran twice:
    nothing then shows how the machine's times move, and a bootstrap of such a run's own steps
    gives a spread of 0 (a twin's run keeps its bootstrap's: it has no machine)."""
    spreads = bootstrap_spreads(history, others)
    relative = spreads.pop(_RELATIVE_THROUGHPUT, np.nan)
    if _is_number(row.get("output tokens/s")):
        spreads["output tokens/s"] = relative * float(row["output tokens/s"])
    jitter = np.nan if others else step_jitter(history)
    simulated = (getattr(history, "meta", None) or {}).get("simulated", False)
    if not others and np.isnan(jitter) and not simulated:  # (a twin's clock has no jitter)
        return {**spreads, **dict.fromkeys((*TIMED, "device busy (%)"), np.nan)}
    for name in TIMED if not np.isnan(jitter) else ():
        value = row.get(name)
        if _is_number(value) and not np.isnan(value):
            floor = jitter * abs(float(value))
            spreads[name] = float(np.nanmax([spreads.get(name, np.nan), floor]))
    return spreads


def combine(rows: list[dict], spreads: list[dict[str, float]]) -> tuple[dict, dict]:
    """One setting's figures (means over its repeats; what is not a number, the first's) and
    spreads (the larger of the repeats' range and their median `run_spreads`)."""
    first = rows[0]
    values, spread = {}, {}
    for name, value in first.items():
        column = [row.get(name) for row in rows]
        numeric = pd.to_numeric(pd.Series(column, dtype=object), errors="coerce")
        if not _is_number(value) or numeric.isna().all():
            values[name] = value
            continue
        mean = float(numeric.mean())
        # counts stay counts where every repeat gave the same one
        values[name] = int(mean) if _all_integers(column) and mean.is_integer() else mean
        boot = [s[name] for s in spreads if name in s and not np.isnan(s[name])]
        ranged = float(numeric.max() - numeric.min()) if len(rows) > 1 else np.nan
        candidates = [v for v in (ranged, float(np.median(boot)) if boot else np.nan) if v == v]
        spread[name] = max(candidates) if candidates else np.nan
    return values, spread


# a run's meta that says what ran it, not which run it was
# "settings": the keywords as the comparison wrote them; the meta holds what they resolved to
_NOT_SETTINGS = ("run", "repeat", "texts", "warmup_ms", "settings")


def setting_key(history) -> str | None:
    """A run's meta without what names the run (None: the meta does not say how it was made)."""
    meta = getattr(history, "meta", None) or {}
    if "model" not in meta:
        return None
    return repr(sorted((k, repr(v)) for k, v in meta.items() if k not in _NOT_SETTINGS))


def same_setting_groups(firsts: dict[str, object]) -> list[list[str]]:
    """The labels of runs that share one setting, in groups of two or more."""
    groups: dict[str, list[str]] = {}
    for label, history in firsts.items():
        key = setting_key(history)
        if key is not None:
            groups.setdefault(key, []).append(label)
    return [labels for labels in groups.values() if len(labels) > 1]


def same_setting_floor(table: pd.DataFrame, groups: list[list[str]]) -> dict[str, float]:
    """Per figure, the largest relative range among runs of one setting (see the module)."""
    floors: dict[str, float] = {}
    for labels in groups:
        values = table.loc[labels].apply(pd.to_numeric, errors="coerce")
        mean = values.mean().abs()
        relative = ((values.max() - values.min()) / mean.where(mean > 0)).dropna()
        for name, share in relative.items():
            floors[name] = max(floors.get(name, 0.0), float(share))
    return floors


def _is_number(value) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _all_integers(column: list) -> bool:
    return all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in column)
