"""Views of a run: Altair charts, the live dashboard, the static report. Each reads a history.

Every chart of `charts.CHARTS` is here by its name (``viz.batch_composition(history)``), with the
comparisons of several runs, `write_report` and `Dashboard` (imported on first use)."""

from . import charts
from .charts import CHARTS, Chart
from .common import vega_offline
from .compare import compare_chart, compare_table, request_latencies
from .compare_summary import compare_summary
from .pool_charts import hit_rate_chart
from .report import write_report
from .sweep import sweep_chart


def _render_offline() -> None:
    # NOTE: Altair's default renderer loads Vega from a CDN; a user's own choice is kept
    import altair as alt

    if alt.renderers.active != "default" or not vega_offline(warn=False):
        return
    try:
        import anywidget  # noqa: F401 (the "jupyter" renderer draws through it)
    except ImportError:
        alt.renderers.enable("html", template="inline")
    else:
        alt.renderers.enable("jupyter", offline=True)


_render_offline()

__all__ = [
    *(chart.name for chart in CHARTS),
    "CHARTS",
    "Chart",
    "Dashboard",
    "compare_chart",
    "compare_summary",
    "compare_table",
    "hit_rate_chart",
    "sweep_chart",
    "request_latencies",
    "vega_offline",
    "write_report",
]


def __getattr__(name: str):
    if name in charts.BY_NAME:
        return charts.BY_NAME[name].function
    if name == "Dashboard":  # imported on first use: it needs ipywidgets
        from .dashboard import Dashboard

        return Dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *charts.BY_NAME})
