"""Prefix-cache hits against the KV pool's size: runs of one trace on pools of several sizes
(`workbench.pool_sweep`), each beside the trace's ideal, which no pool's cache passes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .reuse import reuse_of

if TYPE_CHECKING:
    import pandas as pd

    from .trace import Trace


def pool_reuse(runs: Mapping[object, object], trace: Trace) -> pd.DataFrame:
    """One row per run of `trace` (`pool_sweep`'s, or any runs by name), indexed by its KV pool's
    size in pages (its meta's `num_pages`), smallest first: the pool in tokens, then the prefix
    cache's hits in tokens and in blocks, each beside the ideal's (an unbounded cache, the
    requests one at a time in trace order), read from the run's requests table as
    `prefix_reuse` reads it."""
    import pandas as pd

    if not isinstance(runs, Mapping) or not runs:
        raise ValueError(f"runs must be a non-empty mapping of runs (pool_sweep's), got {runs!r}")
    rows, labels = {}, {}
    for label, run in runs.items():
        meta = getattr(run, "meta", None) or {}
        if "num_pages" not in meta or "page_size" not in meta:
            raise ValueError(
                f"run {label!r} does not say its KV pool's size (its meta has no num_pages or "
                "page_size): a run of Workbench, compare or pool_sweep does"
            )
        num_pages = int(meta["num_pages"])
        if num_pages in rows:
            raise ValueError(
                f"runs {labels[num_pages]!r} and {label!r} both have a pool of {num_pages} pages: "
                "the table has a row a pool size, so give one run of each"
            )
        labels[num_pages] = label
        ideal, ran = reuse_of(run, trace)
        rows[num_pages] = {
            "pool_tokens": num_pages * int(meta["page_size"]),
            "requests": ran.requests,
            "prompt_tokens": ran.prompt_tokens,
            "hit_tokens": ran.hit_tokens,
            "token_hit_rate": ran.token_hit_rate,
            "ideal_token_hit_rate": ideal.token_hit_rate,
            "prompt_blocks": ran.prompt_blocks,
            "hit_blocks": ran.hit_blocks,
            "block_hit_rate": ran.block_hit_rate,
            "ideal_block_hit_rate": ideal.block_hit_rate,
        }
    table = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    table.index.name = "num_pages"
    table.attrs["block_size"] = trace.block_size
    return table
