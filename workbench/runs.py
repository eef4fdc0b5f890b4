"""A finished run with its views: what `load_run` and `Workbench.snapshot` give."""

from __future__ import annotations

from pathlib import Path

from .history.history import RunTables


class RunHistory(RunTables):
    """A run's tables, read-only, with the dashboard and the report. `repeats`: every run of
    its setting when `Workbench.compare(..., repeats=N)` ran it several times."""

    def __init__(self, frames, meta: dict) -> None:
        super().__init__(frames, meta)
        self.repeats: tuple[RunHistory, ...] = (self,)

    def dashboard(self):
        """The dashboard's views of this run, without the engine's buttons."""
        from .viz.dashboard import Dashboard

        return Dashboard(self)

    def report(self, path: str | Path, title: str | None = None) -> Path:
        """Write this run as one self-contained HTML report."""
        from .viz.report import write_report

        return write_report(self, path, title=title, meta=self.meta)


def load_run(path: str | Path) -> RunHistory:
    """A run saved with `Workbench.save` (Parquet, or the JSON of older runs)."""
    return RunHistory.read(path)
