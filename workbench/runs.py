"""A finished run with its views: what `load_run` and `Workbench.snapshot` give."""

from __future__ import annotations

from pathlib import Path

from .history.history import RunTables


class RunHistory(RunTables):
    """A run's tables (a saved run, or a snapshot of a live one), read-only, with the views
    every history has: the dashboard and the report. `repeats`: the runs of its setting when
    `Workbench.compare(..., repeats=N)` ran it several times (itself among them, in the order
    they ran), which `compare_table` and `compare_summary` read; a run alone is its only
    one."""

    def __init__(self, frames, meta: dict) -> None:
        super().__init__(frames, meta)
        self.repeats: tuple[RunHistory, ...] = (self,)

    def dashboard(self):
        """The dashboard's views of this run: the step slider, the request picker and every
        chart, without the engine's buttons (`wb.dashboard()` drives a live workbench)."""
        from .viz.dashboard import Dashboard

        return Dashboard(self)

    def report(self, path: str | Path, title: str | None = None) -> Path:
        """One self-contained HTML file of this run (no network)."""
        from .viz.report import write_report

        return write_report(self, path, title=title, meta=self.meta)


def load_run(path: str | Path) -> RunHistory:
    """A run saved with `Workbench.save` (or `History.save`), ready for every view: a Parquet
    file (told by its first bytes, whatever its name) or the JSON of older runs."""
    return RunHistory.read(path)
