"""An MoE model's routing, as a step's record keeps it (int32 [MoE layers, experts]: the tokens
each expert received) and as the tables show it. Defined once here, read by every view:

- ``experts_touched``: per MoE layer, the experts that received at least one token; the mean
  over the MoE layers. It is what a step must read of the experts' weights.
- ``expert_imbalance``: per MoE layer, the most tokens an expert received over the mean per
  expert (tokens x top-k / experts; 1: even); the mean over the MoE layers.

Both are NaN for a dense model's steps. The ``routing`` table holds the counts themselves, one
row per (step, layer, expert) that received tokens (`RoutingRow`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


class RoutingRow(NamedTuple):
    """The tokens one expert of one MoE layer received in one step (none: no row)."""

    step: int
    layer: int  # the decoder layer
    expert: int
    tokens: int


# NOTE: compact dtypes: an MoE run has a row per expert touched per layer per step
ROUTING_DTYPES = {"step": "int64", "layer": "int16", "expert": "int16", "tokens": "int32"}


def experts_touched(counts: np.ndarray | None) -> float:
    """The mean over MoE layers of the experts given at least one token (NaN: dense)."""
    if counts is None or counts.size == 0:
        return math.nan
    return np.count_nonzero(counts) / counts.shape[0]  # (a step's: one pass, no temporaries)


def expected_touched(tokens: int, experts: int, top_k: int) -> float:
    """The mean experts touched per MoE layer by `tokens` tokens, each choosing its `top_k` of
    `experts` uniformly at random: E x (1 - (1 - k / E) ** T)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def expert_imbalance(counts: np.ndarray | None) -> float:
    """The mean over MoE layers of the most tokens an expert got over the mean per expert
    (NaN: dense, or a step that routed nothing)."""
    if counts is None or counts.size == 0:
        return math.nan
    mean = counts.sum(axis=1) / counts.shape[1]  # (np.mean's figures, in fewer passes)
    if mean.min() <= 0:
        return math.nan
    return float((counts.max(axis=1) / mean).mean())


class RoutingColumns:
    """The routing table's columns, gathered record by record (nonzero counts only)."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, step: int, layers: tuple[int, ...], counts: np.ndarray) -> None:
        moe, expert = np.nonzero(counts)
        layer = np.asarray(layers, dtype=np.int64)[moe]
        self.parts.append((np.full(len(moe), step), layer, expert, counts[moe, expert]))

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        columns = RoutingRow._fields
        if not self.parts:
            arrays = [np.zeros(0)] * len(columns)
        else:
            arrays = [np.concatenate(part) for part in zip(*self.parts)]
        return pd.DataFrame(dict(zip(columns, arrays))).astype(ROUTING_DTYPES)
