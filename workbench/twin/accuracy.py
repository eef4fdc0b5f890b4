"""The twin's own error: its runs against real runs of the same settings, beside the real runs'
run-to-run noise (a twin cannot be asked to be closer than two real runs are to each other)."""

from __future__ import annotations

import re

import numpy as np

from ..history.latency import FIGURES, run_figures
from .costs import StepCosts
from .runs import named_runs

STEP_ERROR = "step device time"  # the per-step figures (their errors only)
PROMPT_STEP_ERROR = "prompt step device time"
_REPEAT = re.compile(r"\s*#\d+$")
_NUMBERS = re.compile(r"(\d+)")


def validate_twin(real_runs, twin_runs, costs: StepCosts | None = None):
    """A table (pandas) per setting and figure: real (the mean of the real runs named like the
    twin run, " #N" aside), predicted, error_pct, noise_pct (the real runs' spread) and
    uncalibrated_pct, plus the step costs' per-step device-time error on the real steps.
    `costs`: None for those the twin runs say they ran on."""
    import pandas as pd

    if costs is not None and not isinstance(costs, StepCosts):
        raise TypeError(
            f"costs must be StepCosts (fit_step_costs) or None for those the twin runs ran on, "
            f"got {type(costs).__name__} {costs!r:.60}"
        )
    real = _by_setting(named_runs(real_runs))
    rows = []
    for name, twin in named_runs(twin_runs).items():
        reals = real.get(_REPEAT.sub("", name))
        if reals is None:
            raise ValueError(
                f"no real run of setting {name!r} (real runs: {sorted(real)}); name each twin "
                "run as its real runs are (without their ' #N')"
            )
        measured = [run_figures(h) for h in reals]
        predicted = run_figures(twin)
        step_costs = costs if costs is not None else _costs_of(twin, name)
        guessed = step_costs.uncalibrated(twin.steps) != ""
        uncalibrated = float(guessed.mean() * 100) if len(guessed) else np.nan
        for figure in FIGURES:
            values = np.array([m[figure] for m in measured], dtype=float)
            rows.append(
                _row(name, figure, values, predicted[figure]) | {"uncalibrated_pct": uncalibrated}
            )
        errors = np.array([_step_errors(step_costs, h) for h in reals])  # [run, all / prompt]
        for figure, per_run in zip((STEP_ERROR, PROMPT_STEP_ERROR), errors.T):
            known = per_run[~np.isnan(per_run)]
            error = float(np.median(known)) if len(known) else np.nan
            rows.append(
                {
                    "setting": name,
                    "figure": figure,
                    "real": np.nan,
                    "predicted": np.nan,
                    "error_pct": error,
                    "noise_pct": np.nan,
                    "uncalibrated_pct": uncalibrated,
                }
            )
    table = pd.DataFrame(rows)
    # NOTE: settings in natural order (chunk 512 before chunk 2048), kept by pivots and groupbys
    settings = sorted(set(table.setting), key=setting_order)
    table["setting"] = pd.Categorical(table.setting, categories=settings, ordered=True)
    return table.sort_values("setting", kind="stable", ignore_index=True)


def setting_order(name: str) -> tuple:
    """A setting's name as a sort key whose numbers sort as numbers: "chunk 512 mixed" before
    "chunk 2048 mixed"."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(_NUMBERS.split(name)))


def validation_summary(table):
    """Per figure, over the settings: the median and largest |error| and the median noise (%)."""
    table = table.assign(abs_error_pct=table.error_pct.abs())
    grouped = table.groupby("figure", sort=False)
    return grouped.agg(
        median_error_pct=("abs_error_pct", "median"),
        max_error_pct=("abs_error_pct", "max"),
        median_noise_pct=("noise_pct", "median"),
        settings=("setting", "nunique"),
    ).round(2)


def _row(name: str, figure: str, values: np.ndarray, predicted: float) -> dict:
    real = float(values.mean())
    spread = float(values.max() - values.min()) if len(values) > 1 else np.nan
    return {
        "setting": name,
        "figure": figure,
        "real": real,
        "predicted": float(predicted),
        "error_pct": (predicted - real) / real * 100 if real else np.nan,
        "noise_pct": spread / real * 100 if real else np.nan,
    }


def _by_setting(named: dict) -> dict[str, list]:
    groups: dict[str, list] = {}
    for name, history in named.items():
        groups.setdefault(_REPEAT.sub("", name), []).append(history)
    return groups


def _costs_of(twin, name: str) -> StepCosts:
    saved = twin.meta.get("step_costs")
    if saved is None:
        raise ValueError(f"twin run {name!r} does not say its step costs: give costs=")
    return StepCosts.from_dict(saved)


def _step_errors(costs: StepCosts, history) -> tuple[float, float]:
    steps = history.steps
    device, _ = costs.predict_steps(steps)
    real = steps.device_ms.to_numpy(dtype=float)
    error = np.abs(device - real) / np.where(real > 0, real, np.nan)
    measured = real > 0
    prompt = measured & (steps.phase != "decode").to_numpy()
    return tuple(
        float(np.median(error[rows]) * 100) if rows.any() else np.nan for rows in (measured, prompt)
    )
