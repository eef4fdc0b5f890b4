"""Altair charts: pure functions from a run history to a chart, and their registry.

Long runs are aggregated before they reach Altair: a browser wants few marks. `CHARTS` lists
every chart in the order the views show them; adding one is its function and one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .moe_charts import expert_load, experts_touched, has_routing
from .rank_charts import has_rank_skew, rank_skew
from .request_charts import admissions, ledger_bars, ledger_lines, page_table
from .slo_charts import has_slo, slo_misses
from .step_charts import (
    batch_composition,
    has_ranks,
    kernel_timeline,
    kv_usage,
    rank_times,
    step_breakdown,
    step_times,
)


class Chart(NamedTuple):
    """One chart of the views: its function and the keywords it takes the focus by."""

    name: str
    title: str  # in the report; "{step}" is the step it shows
    function: Callable[..., Any]
    step: str | None  # the keyword that takes the step in focus (None: it takes none)
    uid: str | None = None
    per_step: bool = False  # it draws one step (the one in focus), not the whole run
    wide: bool = False  # a row of the dashboard of its own
    shown: Callable[[Any], bool] | None = None  # in the views only for the histories it says

    def draw(self, history, step: int | None = None, uid: int | None = None):
        """The chart of `history` for this step and request in focus."""
        focus = {}
        if self.step is not None and (step is not None or not self.per_step):
            focus[self.step] = step
        if self.per_step and step is None:  # the last step
            steps = history.steps
            focus[self.step] = int(steps.step.iloc[-1]) if len(steps) else 0
        if self.uid is not None:
            focus[self.uid] = uid
        return self.function(history, **focus)

    def applies(self, history) -> bool:
        return self.shown is None or self.shown(history)


CHARTS = (
    Chart("batch_composition", "Batch composition", batch_composition, "highlight_step"),
    Chart("ledger_bars", "Ledgers at step {step}", ledger_bars, "step", "highlight_uid", True),
    Chart("kv_usage", "KV pool", kv_usage, "highlight_step"),
    Chart("page_table", "Page table at step {step}", page_table, "step", "highlight_uid", True),
    Chart("step_times", "Host and device time per step", step_times, "highlight_step", wide=True),
    Chart("step_breakdown", "Where the time went", step_breakdown, "highlight_step"),
    Chart("kernel_timeline", "Timeline of step {step}", kernel_timeline, "step", per_step=True),
    Chart(
        "experts_touched",
        "Experts touched per step",
        experts_touched,
        "highlight_step",
        shown=has_routing,
    ),
    Chart(
        "expert_load",
        "Tokens per expert at step {step}",
        expert_load,
        "step",
        per_step=True,
        shown=has_routing,
    ),
    Chart("ledger_lines", "Lengths over steps", ledger_lines, "highlight_step", "highlight_uid"),
    Chart("admissions", "Admissions", admissions, None, "highlight_uid"),
    Chart("rank_times", "Device time of each rank", rank_times, "highlight_step", shown=has_ranks),
    Chart(
        "rank_skew",
        "Skew of the ranks at their all-reduces",
        rank_skew,
        "highlight_step",
        shown=has_rank_skew,
    ),
    Chart(
        "slo_misses",
        "Why requests missed the SLO",
        slo_misses,
        None,
        "highlight_uid",
        shown=has_slo,
    ),
)
BY_NAME = {chart.name: chart for chart in CHARTS}
