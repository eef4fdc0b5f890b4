"""What the twin says an MoE model's step routed, having no model to route with.

A token choosing its top-k of E experts uniformly at random, T tokens chosen independently touch,
per MoE layer, E x (1 - (1 - k / E) ** T) experts on average. A decoding request's token is
such a token. The tokens of one prompt chunk need not be: they share a request, and a router
may send them to the same experts far more often than chance (on dummy Qwen3-30B-A3B's random
weights, 64 prompt tokens touched 14 experts of 128 where 64 independent tokens touch 126). So
a chunk of n tokens counts as n ** s independent tokens, with the spread s (0: the chunk routes
as one token, 1: as n independent ones) fitted on the calibration runs' recorded steps
(`fit_prompt_spread`). The twin's step touches the expected number (rounded), each given an even
share of the step's choices. Its experts touched, and so the bytes its roofline reads and the
`experts` feature its step costs are predicted on, follow a real router's on average; which
experts (a window moving with the step and the layer) and how unevenly they are loaded are not
predictions.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from ..history.routing import expected_touched

SPREADS = np.linspace(0.0, 1.0, 101)  # the spreads `fit_prompt_spread` tries


def independent_tokens(decode: int, prompt_rows, prompt_tokens, spread: float):
    """The tokens routed independently that a step's choices are worth: each decoding token,
    and each of `prompt_rows` prompt chunks (of `prompt_tokens` together, taken as equal) as
    (its tokens) ** `spread`. Scalars, or arrays of steps."""
    rows = np.maximum(prompt_rows, 1)
    return decode + np.where(prompt_rows > 0, rows * (prompt_tokens / rows) ** spread, 0.0)


def fit_prompt_spread(steps: pd.DataFrame, experts: int, top_k: int) -> tuple[float, int, float]:
    """The spread (`independent_tokens`) whose expected experts touched best match (least
    squares) the recorded `experts_touched` of the steps with prompt tokens; with how many steps
    it was fitted on and their median relative error. 1.0 (independent tokens) without any."""
    prompt = steps[(steps.phase != "decode") & steps.experts_touched.notna()]
    if prompt.empty:
        return 1.0, 0, float("nan")
    decode = prompt.decode_tokens.to_numpy(dtype=float)
    rows = (prompt.batch_size - prompt.decode_tokens).to_numpy(dtype=float)
    tokens = (prompt.num_tokens - prompt.decode_tokens).to_numpy(dtype=float)
    real = prompt.experts_touched.to_numpy(dtype=float)
    expected = np.array(
        [expected_touched(independent_tokens(decode, rows, tokens, s), experts, top_k)
         for s in SPREADS]
    )  # fmt: skip
    best = int(np.argmin(((expected - real) ** 2).sum(axis=1)))
    error = np.median(np.abs(expected[best] - real) / real) * 100
    return float(SPREADS[best]), len(prompt), float(error)


def estimated_routing(
    decode: int,
    prompt_rows: int,
    prompt_tokens: int,
    layers: int,
    experts: int,
    top_k: int,
    step: int,
    spread: float = 1.0,
) -> np.ndarray:
    """int32 [layers, experts]: in each layer, the expected experts touched (rounded, at least
    `top_k`) by `decode` decoding tokens and `prompt_rows` chunks of `prompt_tokens` prompt
    tokens, the step's choices spread evenly over them. Shared by the steps that route alike:
    never written (a step's record keeps a copy)."""
    choices = (decode + prompt_tokens) * top_k
    if choices == 0:
        return _counts(layers, experts, top_k, 0, 0, 0)
    tokens = independent_tokens(decode, prompt_rows, prompt_tokens, spread)
    touched = round(float(expected_touched(tokens, experts, top_k)))
    touched = min(max(touched, top_k), experts, choices)
    return _counts(layers, experts, top_k, choices, touched, step * touched % experts)


@functools.lru_cache(maxsize=512)  # (a 30B-A3B step's: 24 KB)
def _counts(layers: int, experts: int, top_k: int, choices: int, touched: int, start: int):
    """`choices` spread evenly over `touched` experts a layer, layer l's window from expert
    `start + l * top_k` (a twin's steps repeat these: one array each)."""
    counts = np.zeros((layers, experts), dtype=np.int32)
    if choices:
        share = np.full(touched, choices // touched, dtype=np.int32)
        share[: choices % touched] += 1
        first = (start + np.arange(layers) * top_k) % experts  # a window per layer
        counts[np.arange(layers)[:, None], (first[:, None] + np.arange(touched)) % experts] = share
    return counts
