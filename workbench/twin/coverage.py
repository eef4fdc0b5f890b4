"""Where step costs are guessing: what in a step's composition the calibration runs did not
cover (`StepCosts.uncalibrated`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from .features import PATHS, UNITS, shape_keys, step_features

MIN_SHAPE_STEPS = 20  # calibration steps a captured shape needs for a factor of its own
RANGE_SLACK = 0.1  # how far beyond a feature's calibrated range still counts, as a share of it


def uncalibrated(
    steps,
    fitted: Collection[str],
    ranges: Mapping[str, Mapping[str, tuple[float, float]]],
    shape_steps: Mapping[str, Mapping[str, int]],
) -> np.ndarray:
    """Per step: why calibration did not cover it ("; "-joined: a path never taken, a shape
    replayed too rarely, a feature beyond its calibrated range), "" where it did."""
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
