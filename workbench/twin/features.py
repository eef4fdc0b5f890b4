"""What a step's cost is fitted on: its composition, the same whether read from a recorded
steps table or from a batch the twin is about to run.

A step runs one of three paths. A CUDA-graph decode step ("graph") replays one captured graph of
its padded size; a prefill or mixed step of a captured shape ("prompt_graph") replays one of
its padded tokens and requests; every other step ("eager": on the CPU, too large to capture, or
of an engine without such graphs) launches the layers one by one. Per step:

- `rows`: the requests as run (a graph pads them); `tokens`: the tokens computed (thousands,
  padding included), and `tokens_over`: those beyond `KNEE` (the matmuls stop being bound by
  reading the weights and start being bound by FLOPs: a roofline's corner);
- `prefill_pairs`: the causal (query, key) pairs of the prompt tokens (millions);
- `decode_context`: the KV tokens the decoding requests' attention read (thousands);
- `sampled`: the requests that got a token; `prefill_rows`: those computing prompt tokens;
- `prompt`, `decode`: 1 for a step that computes prompt tokens (prefill or mixed: the same
  kernels, the prefill path's) and for one that only decodes (a constant per kind).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from ..core import Batch

KNEE = 512  # tokens
PATHS = ("graph", "prompt_graph", "eager")
# the features of each path's device time, and of each host stage's time (both paths)
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
# each host stage on what its work grows with (no more: the host's time is noisy, and a
# feature that only soaks up its noise in the runs fitted extrapolates that noise elsewhere)
HOST_FEATURES = {
    "schedule": ("1", "prefill_rows"),  # admission: a decision per admitted prompt
    "prepare": ("1", "rows", "tokens"),  # pages, positions, input ids
    "plan": ("1", "rows"),  # attention metadata per request
    "forward": ("1", "tokens"),  # launching the layers (a graph: one replay)
    "sample": ("1", "sampled"),
    "share": ("1", "prefill_rows", "tokens"),  # prompts' pages to the prefix cache
    "collect": ("1", "sampled"),  # a token per request
    "record": ("1", "rows"),
}
# how each feature is counted (what one unit of its coefficient is per)
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
        },
        index=steps.index,
    )
    return frame


def batch_features(
    batch: Batch, padded_size: int, padded_tokens: int, graph: bool
) -> dict[str, float]:
    """The features of a batch about to run (its ledger as launched) as `step_features` gives
    them for the step it becomes, and its `path`; `graph`: it replays a captured graph."""
    _, cached, device_len = batch.ledger
    nd = batch.num_decode
    extend = device_len[nd:] - cached[nd:]
    tokens = padded_tokens
    pairs = int((extend * cached[nd:]).sum() + (extend * (extend + 1) // 2).sum())
    phase = batch.phase
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
        "path": ("graph" if phase == "decode" else "prompt_graph") if graph else "eager",
    }


def shape_keys(path: str, rows, tokens):
    """The captured shape of a graph step (one, or arrays of them) from its features: its
    padded requests ("8"), and for a prompt graph its padded tokens too ("8x128")."""
    if np.ndim(rows) == 0:
        return f"{int(rows)}" if path == "graph" else f"{int(rows)}x{round(tokens * 1e3)}"
    return [shape_keys(path, r, t) for r, t in zip(rows, tokens)]
