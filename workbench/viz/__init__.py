"""Views of a run: Altair charts, the live dashboard, the static report. Each reads a history."""

from .charts import (
    admissions,
    batch_composition,
    kernel_timeline,
    kv_usage,
    ledger_bars,
    ledger_lines,
    page_table,
    step_breakdown,
)
from .compare import compare_chart, compare_table, request_latencies

__all__ = [
    "admissions",
    "batch_composition",
    "compare_chart",
    "compare_table",
    "kernel_timeline",
    "kv_usage",
    "ledger_bars",
    "ledger_lines",
    "page_table",
    "request_latencies",
    "step_breakdown",
]
