"""Where step costs are guessing: what in a step's composition the calibration runs did not
cover (`StepCosts.uncalibrated`).

A captured shape needs `MIN_SHAPE_STEPS` calibration steps for a device-time factor of its own
(`StepCosts.shapes`; one with fewer borrows a factor: `shape_factor`); a feature counts as
covered up to `RANGE_SLACK` of its calibrated range's width beyond it (`StepCosts.ranges`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from .features import PATHS, UNITS, shape_keys, step_features

# the calibration steps a captured shape needs for its own factor (fewer: the fit alone)
MIN_SHAPE_STEPS = 20
# how far beyond the calibrated range of a feature a step may be and still count as within it,
# as a share of the range's width
RANGE_SLACK = 0.1


def uncalibrated(
    steps,
    fitted: Collection[str],
    ranges: Mapping[str, Mapping[str, tuple[float, float]]],
    shape_steps: Mapping[str, Mapping[str, int]],
) -> np.ndarray:
    """Per step of a steps table: what calibration runs did not cover in its composition, ""
    where they did; `fitted`: the paths they fitted, `ranges` and `shape_steps` as
    `StepCosts` keeps them. Reasons, joined by "; ": its path was never taken
    ("eager: no calibration step"; its time then comes from another path's fit), its
    captured shape was replayed fewer than `MIN_SHAPE_STEPS` times, too few for a factor
    of its own ("shape 8x1024: 2 calibration steps"), or a feature lies beyond the range
    the calibration steps of its path spanned, by more than `RANGE_SLACK` of its width
    ("decode_context 13.4 > 11.1 (1k KV tokens read)"). Costs saved before ranges were
    kept say nothing of features and shapes."""
    features = step_features(steps)
    out = np.full(len(features), "", dtype=object)
    for path in PATHS:
        rows = np.flatnonzero((features.path == path).to_numpy())
        if not len(rows):
            continue
        if path not in fitted:
            out[rows] = f"{path}: no calibration step"
            continue
        f = features.iloc[rows]
        reasons: list[list[str]] = [[] for _ in rows]
        if path in shape_steps:
            seen = shape_steps[path]
            keys = shape_keys(path, f.rows.to_numpy(), f.tokens.to_numpy())
            for i, key in enumerate(keys):
                if seen.get(key, 0) < MIN_SHAPE_STEPS:
                    reasons[i].append(f"shape {key}: {seen.get(key, 0)} calibration steps")
        for name, (lo, hi) in ranges.get(path, {}).items():
            values, slack = f[name].to_numpy(dtype=float), RANGE_SLACK * (hi - lo) + 1e-9
            over, under = values > hi + slack, values < lo - slack
            for i in np.flatnonzero(over | under).tolist():
                sign, bound = (">", hi) if over[i] else ("<", lo)
                reasons[i].append(f"{name} {values[i]:.4g} {sign} {bound:.4g} ({UNITS[name]})")
        out[rows] = ["; ".join(r) for r in reasons]
    return out


def shape_factor(path: str, factors: Mapping[str, float], key: str) -> float:
    """The device-time factor of captured shape `key` among a path's `factors`: its own; for
    a decode graph the runs did not replay often enough, the nearest size's in powers of two (a
    graph of 64 requests takes 32's: the kernels chosen for a size change little from one size
    to the next, and on the H200 the fit alone was 6% short of 64's); else 1."""
    if key in factors:
        return factors[key]
    if path != "graph":
        return 1.0
    size = np.log2(int(key))
    return factors[min(factors, key=lambda k: abs(np.log2(int(k)) - size))]
