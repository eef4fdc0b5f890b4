"""Altair charts: pure functions from a run history to a chart.

A history is anything with the tables `steps`, `ledger`, `requests`, `admissions`, `events` and
`pages` (a live `History` or a loaded `RunHistory`). Nothing here needs the engine, and nothing
loads from the network. Long runs are aggregated before they reach Altair (its row limit is
5,000 and a browser wants far fewer marks than that).

The charts live by what they show: `step_charts` (batches, the KV pool, time per step) and
`request_charts` (ledgers, page tables, admissions); this module gathers them.
"""

from .request_charts import (
    _sharing_segments,  # noqa: F401 (the tests check it here)
    admissions,
    ledger_bars,
    ledger_lines,
    page_table,
)
from .step_charts import (
    batch_composition,
    kernel_timeline,
    kv_usage,
    rank_times,
    step_breakdown,
    step_times,
)

__all__ = [
    "admissions",
    "batch_composition",
    "kernel_timeline",
    "kv_usage",
    "ledger_bars",
    "ledger_lines",
    "page_table",
    "rank_times",
    "step_breakdown",
    "step_times",
]
