"""What the twin says an MoE model's step routed, having no model to route with: each token
choosing its top-k of E experts uniformly at random, a step of T tokens touches, per MoE layer,
E x (1 - (1 - k / E) ** T) experts on average; the twin's step touches that many (rounded),
each given an even share of the T x k choices. Its experts touched, and so the bytes its
roofline reads and the `experts` feature its step costs are predicted on, follow the step's
tokens as a real router's would on average; which experts (a window moving with the step and
the layer) and how unevenly they are loaded are not predictions.
"""

from __future__ import annotations

import numpy as np

from ..history.routing import expected_touched


def uniform_routing(tokens: int, layers: int, experts: int, top_k: int, step: int) -> np.ndarray:
    """int32 [layers, experts]: in each layer, `expected_touched` experts (rounded, at least
    `top_k`), the tokens' `top_k` choices each spread evenly over them."""
    counts = np.zeros((layers, experts), dtype=np.int32)
    choices = tokens * top_k
    if choices == 0:
        return counts
    touched = round(expected_touched(tokens, experts, top_k))
    touched = min(max(touched, top_k), experts, choices)
    share = np.full(touched, choices // touched, dtype=np.int32)
    share[: choices % touched] += 1
    first = (step * touched + np.arange(layers) * top_k) % experts  # a window per layer
    counts[np.arange(layers)[:, None], (first[:, None] + np.arange(touched)) % experts] = share
    return counts
