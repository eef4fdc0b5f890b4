"""Views of a run: Altair charts, the live dashboard, the static report. Each reads a history."""

from .charts import (
    admissions,
    batch_composition,
    kernel_timeline,
    kv_usage,
    ledger_bars,
    ledger_lines,
    page_table,
    rank_times,
    step_breakdown,
    step_times,
)
from .compare import compare_chart, compare_table, request_latencies
from .report import write_report


def _render_offline() -> None:
    """Charts shown in a notebook draw with a local copy of Vega: Altair's default renderer loads
    it from a CDN, so without the internet nothing shows. The user's own choice of renderer
    stays; without anywidget, charts carry the Vega bundle inline in their HTML."""
    import altair as alt

    if alt.renderers.active != "default":
        return
    try:
        import anywidget  # noqa: F401 (the "jupyter" renderer draws through it)
    except ImportError:
        alt.renderers.enable("html", template="inline")
    else:
        alt.renderers.enable("jupyter", offline=True)


_render_offline()

__all__ = [
    "admissions",
    "batch_composition",
    "compare_chart",
    "compare_table",
    "Dashboard",
    "kernel_timeline",
    "kv_usage",
    "ledger_bars",
    "ledger_lines",
    "page_table",
    "rank_times",
    "request_latencies",
    "step_breakdown",
    "step_times",
    "write_report",
]


def __getattr__(name: str):
    if name == "Dashboard":  # imported on first use: it needs ipywidgets
        from .dashboard import Dashboard

        return Dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
