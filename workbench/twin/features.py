"""What a step's cost is fitted on: its composition (`UNITS`), the same whether read from a
recorded steps table or from a batch the twin is about to run.

A step runs one of three paths: a decode step replaying a captured CUDA graph ("graph"), a
prefill or mixed step replaying one ("prompt_graph"), or layers launched one by one ("eager").
An MoE model's device time also grows with the experts its step touched (`MOE_FEATURE`: the
steps table's `experts_touched`), on every path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from ..core import Batch

KNEE = 512  # tokens: where matmuls turn from bound by reading weights to bound by FLOPs
PATHS = ("graph", "prompt_graph", "eager")
DEVICE_FEATURES = {
    "graph": ("1", "rows", "decode_context"),
    "prompt_graph": (
        "prompt",
        "tokens",
        "tokens_over",
        "prefill_pairs",
        "decode_context",
        "sampled",
    ),
    "eager": (
        "prompt",
        "decode",
        "tokens",
        "tokens_over",
        "prefill_pairs",
        "decode_context",
        "sampled",
    ),
}
MOE_FEATURE = "experts"  # of an MoE model's steps only: dense runs' fits do not have it


def device_features(path: str, moe: bool) -> tuple[str, ...]:
    """The features a path's device time is fitted on, for a dense or an MoE model."""
    return DEVICE_FEATURES[path] + ((MOE_FEATURE,) if moe else ())


def is_moe(steps: pd.DataFrame) -> bool:
    """Whether a steps table is an MoE model's (it counts the experts its steps touched)."""
    return "experts_touched" in steps and bool(steps.experts_touched.notna().any())


# NOTE: each host stage on what its work grows with, no more: a feature that only soaks up the
# host's noise extrapolates that noise
HOST_FEATURES = {
    "schedule": ("1", "prefill_rows"),
    "prepare": ("1", "rows", "tokens"),
    "plan": ("1", "rows"),
    "forward": ("1", "tokens"),
    "sample": ("1", "sampled"),
    "share": ("1", "prefill_rows", "tokens"),
    "collect": ("1", "sampled"),
    "record": ("1", "rows"),
}
UNITS = {
    "1": "step",
    "prompt": "prefill or mixed step",
    "decode": "decode step",
    "rows": "request",
    "tokens": "1k tokens",
    "tokens_over": f"1k tokens over {KNEE}",
    "prefill_pairs": "1M prompt attention pairs",
    "decode_context": "1k KV tokens read",
    "sampled": "sampled request",
    "prefill_rows": "prompt request",
    "experts": "expert touched per MoE layer",
}


def step_features(steps: pd.DataFrame) -> pd.DataFrame:
    """One row of features per step of a steps table, with its `path` and `phase`."""
    import pandas as pd

    missing = {"sampled", "decode_context", "prefill_pairs"} - set(steps.columns)
    if missing:
        raise ValueError(
            f"the steps table has no {sorted(missing)} columns: the run was recorded by an "
            "older workbench; record it again to fit step costs on it"
        )
    tokens = (steps.num_tokens + steps.padding_tokens).to_numpy(dtype=float)
    graph = steps.cuda_graph.astype(bool).to_numpy()
    phase = steps.phase.astype(str)
    decode = (phase == "decode").to_numpy()
    frame = pd.DataFrame(
        {
            "path": np.select([graph & decode, graph], ["graph", "prompt_graph"], "eager"),
            "phase": phase.to_numpy(),
            "1": 1.0,
            "prompt": (phase != "decode").to_numpy(dtype=float),
            "decode": (phase == "decode").to_numpy(dtype=float),
            "rows": steps.padded_size.to_numpy(dtype=float),
            "tokens": tokens / 1e3,
            "tokens_over": np.maximum(tokens - KNEE, 0) / 1e3,
            "prefill_pairs": steps.prefill_pairs.to_numpy(dtype=float) / 1e6,
            "decode_context": steps.decode_context.to_numpy(dtype=float) / 1e3,
            "sampled": steps.sampled.to_numpy(dtype=float),
            "prefill_rows": (steps.batch_size - steps.decode_tokens).to_numpy(dtype=float),
            "experts": _experts(steps),
        },
        index=steps.index,
    )
    return frame


def _experts(steps: pd.DataFrame) -> np.ndarray:
    if "experts_touched" not in steps:  # recorded before routing was
        return np.zeros(len(steps))
    return np.nan_to_num(steps.experts_touched.to_numpy(dtype=float))


def batch_features(
    batch: Batch, padded_size: int, padded_tokens: int, graph: bool, experts: float = 0.0
) -> dict[str, float]:
    """A batch about to run, as `step_features` gives the step it becomes, with its `path`;
    `experts`: an MoE model's experts touched per MoE layer (0: dense)."""
    _, cached, device_len = batch.ledger
    nd, phase = batch.num_decode, batch.phase
    tokens = padded_tokens
    pairs = 0  # (a decode step's, with no prompt tokens)
    if phase != "decode":
        extend = device_len[nd:] - cached[nd:]
        pairs = int((extend * cached[nd:]).sum() + (extend * (extend + 1) // 2).sum())
    return {
        "1": 1.0,
        "prompt": float(phase != "decode"),
        "decode": float(phase == "decode"),
        "rows": float(padded_size),
        "tokens": tokens / 1e3,
        "tokens_over": max(tokens - KNEE, 0) / 1e3,
        "prefill_pairs": pairs / 1e6,
        "decode_context": int(device_len[:nd].sum()) / 1e3,
        "sampled": float(len(batch.sampled_reqs)),
        "prefill_rows": float(batch.size - nd),
        "experts": experts,
        "path": ("graph" if phase == "decode" else "prompt_graph") if graph else "eager",
    }


def shape_keys(path: str, rows, tokens):
    """A graph step's captured shape (or arrays of them): "8" requests, or "8x128" tokens."""
    if not isinstance(rows, np.ndarray):
        return f"{int(rows)}" if path == "graph" else f"{int(rows)}x{round(tokens * 1e3)}"
    return [shape_keys(path, r, t) for r, t in zip(rows, tokens)]
