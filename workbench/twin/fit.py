"""Non-negative least squares: a negative cost would say that computing more makes a step
faster, and would extrapolate to negative times. Lawson-Hanson, then refitted without outliers
(a garbage collection, a page fault: not what the step's composition costs).
"""

from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, iterations: int = 200) -> np.ndarray:
    """x >= 0 minimising |a x - b| (Lawson-Hanson)."""
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(iterations):
        gradient = a.T @ (b - a @ x)
        free = ~passive & (gradient > 1e-12 * max(1.0, np.abs(gradient).max()))
        if not free.any():
            break
        passive[np.argmax(np.where(free, gradient, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            # NOTE: step back to where the first coefficient reaches zero, and let it go
            shrinking = passive & (z <= 0)
            alpha = np.min(x[shrinking] / (x[shrinking] - z[shrinking]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x


def robust_nnls(
    a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None, cut: float = 6.0
) -> tuple[np.ndarray, np.ndarray]:
    """`nnls` on rows weighted by `weights`, refitted without the rows whose weighted error is
    more than `cut` times the median's; the coefficients and the rows kept."""
    w = np.ones(len(b)) if weights is None else weights
    keep = np.ones(len(b), dtype=bool)
    x = nnls(a * w[:, None], b * w)
    error = np.abs(a @ x - b) * w
    scale = np.median(error)
    if scale > 0:
        keep = error <= cut * scale
        if keep.sum() >= a.shape[1] and not keep.all():
            x = nnls(a[keep] * w[keep, None], b[keep] * w[keep])
    return x, keep
