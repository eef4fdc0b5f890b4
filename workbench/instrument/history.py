"""The run history: every StepRecord, and tidy pandas tables built from them on demand.

Tables (one DataFrame each):
- ``steps``: one row per step (phase, batch composition by kind, queue, KV pool, timings);
- ``ledger``: one row per (step, request in the batch), lengths after that step;
- ``requests``: one row per request (arrival, first scheduled, first token, finish; TTFT, TPOT);
- ``admissions``: one row per admission decision (admitted, or the reason it waited);
- ``events``: one row per profiler event (record="full");
- ``pages``: the page-table rows of each batch as runs of consecutive KV slots (record="full").

Each table's columns are the fields of its row type in `tables.py`.

A history saves to one JSON file and loads back (`load_run`) as a read-only `RunHistory` with the
same tables, which every view can show without a model or a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .tables import TableRows

if TYPE_CHECKING:
    import pandas as pd

    from .record import StepRecord

TABLES = ("steps", "ledger", "requests", "admissions", "events", "pages")


class _Tables:
    """The table accessors shared by a live History and a loaded RunHistory."""

    def tables(self) -> dict[str, pd.DataFrame]:
        raise NotImplementedError

    @property
    def steps(self) -> pd.DataFrame:
        return self.tables()["steps"]

    @property
    def ledger(self) -> pd.DataFrame:
        return self.tables()["ledger"]

    @property
    def requests(self) -> pd.DataFrame:
        return self.tables()["requests"]

    @property
    def admissions(self) -> pd.DataFrame:
        return self.tables()["admissions"]

    @property
    def events(self) -> pd.DataFrame:
        return self.tables()["events"]

    @property
    def pages(self) -> pd.DataFrame:
        return self.tables()["pages"]

    def dashboard(self):
        """The dashboard's views of this run: the step slider, the request picker and every
        chart, without the engine's buttons (`wb.dashboard()` drives a live workbench)."""
        from ..viz.dashboard import Dashboard

        return Dashboard(self)

    def report(self, path: str | Path, title: str | None = None) -> Path:
        """One self-contained HTML file of this run (no network)."""
        from ..viz.report import write_report

        return write_report(self, path, title=title, meta=self.meta)

    def save(self, path: str | Path, meta: dict | None = None) -> Path:
        """Write every table (and `meta`) to one JSON file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"format": "workbench-run/1", "meta": {**self.meta, **(meta or {})}}
        for name, frame in self.tables().items():
            doc[name] = json.loads(frame.to_json(orient="table", index=False, double_precision=15))
        path.write_text(json.dumps(doc))
        return path


class History(_Tables):
    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.arrivals: dict[int, tuple[int, float, int, int]] = {}  # uid -> step, s, prompt, max
        # uid -> (step it ended before, seconds, reason): ended between steps ("abort") or by a
        # step that failed ("error"), so no record carries its finish
        self.aborts: dict[int, tuple[int, float, str]] = {}
        self.meta: dict[str, Any] = {}
        self._cache: dict[str, pd.DataFrame] | None = None
        self._rows = TableRows()

    def arrive(self, uid: int, step: int, seconds: float, prompt_len: int, max_tokens: int) -> None:
        self.arrivals[uid] = (step, seconds, prompt_len, max_tokens)
        self._cache = None

    def abort(self, uid: int, step: int, seconds: float, reason: str = "abort") -> None:
        self.aborts[uid] = (step, seconds, reason)
        self._cache = None

    def append(self, record: StepRecord) -> None:
        self.records.append(record)
        self._cache = None

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> StepRecord:
        return self.records[i]

    def tables(self) -> dict[str, pd.DataFrame]:
        if not self._rows.follows(self.records):  # the records were cleared or replaced
            self._rows, self._cache = TableRows(), None
        if self._rows.count < len(self.records):
            self._cache = None
        if self._cache is None:
            for rec in self.records[self._rows.count :]:
                self._rows.add(rec)
            self._cache = self._rows.frames(self.arrivals, self.aborts)
        return self._cache


class RunHistory(_Tables):
    """A saved run: the same tables, read-only, no engine behind them."""

    def __init__(self, frames: dict[str, pd.DataFrame], meta: dict) -> None:
        self._frames, self.meta = frames, meta

    def tables(self) -> dict[str, pd.DataFrame]:
        return self._frames

    def __len__(self) -> int:
        return len(self._frames["steps"])

    def __repr__(self) -> str:
        return f"RunHistory({len(self)} steps, {len(self.requests)} requests, meta={self.meta})"


def load_run(path: str | Path) -> RunHistory:
    """A run saved with `Workbench.save` (or `History.save`), ready for every view."""
    import io

    import pandas as pd

    doc = json.loads(Path(path).read_text())
    if doc.get("format") != "workbench-run/1":
        raise ValueError(f"{path} is not a saved workbench run")
    frames = {
        name: pd.read_json(io.StringIO(json.dumps(doc[name])), orient="table", precise_float=True)
        for name in TABLES
    }
    return RunHistory(frames, doc.get("meta", {}))


def _build_tables(
    records: list[StepRecord], arrivals: dict, aborts: dict
) -> dict[str, pd.DataFrame]:
    rows = TableRows()
    for rec in records:
        rows.add(rec)
    return rows.frames(arrivals, aborts)
