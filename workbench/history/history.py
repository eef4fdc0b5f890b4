"""The run history: every StepRecord, and tidy pandas tables built from them on demand.

Tables (one DataFrame each):
- ``steps``: one row per step (phase, batch composition by kind, queue, KV pool, timings);
- ``ledger``: one row per (step, request in the batch), lengths after that step;
- ``requests``: one row per request (arrival, first scheduled, first token, finish; TTFT, TPOT);
- ``admissions``: one row per admission decision (admitted, or the reason it waited);
- ``events``: one row per profiler event (record="full");
- ``pages``: what each batch's page-table rows gained, as runs of consecutive KV slots
  (record="full"); ``pages_at(step)`` gives a step's rows whole;
- ``routing``: an MoE model's, the tokens each expert of each MoE layer received per step
  (nonzero counts only; empty for a dense model, and in runs saved before it existed).

Each table's columns are the fields of its row type in `tables.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..timing import add_timing_columns, device_on_host
from . import runfile
from .pages import pages_at
from .routing import RoutingColumns
from .tables import TableRows

if TYPE_CHECKING:
    import pandas as pd

    from ..scheduler.record import StepRecord
    from .roofline import Roofline

TABLES = ("steps", "ledger", "requests", "admissions", "events", "pages", "routing")


class _Tables:
    def tables(self) -> Mapping[str, pd.DataFrame]:
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

    @property
    def routing(self) -> pd.DataFrame:
        tables = self.tables()
        if "routing" in tables:
            return tables["routing"]
        return RoutingColumns().frame()  # a run saved before routing was recorded

    def pages_at(self, step: int) -> pd.DataFrame:
        """The page-table rows of step `step`'s batch, whole, as runs of consecutive KV slots."""
        return pages_at(self.pages, step)

    def save(self, path: str | Path, meta: dict | None = None) -> Path:
        """Write every table (and `meta`) to one Parquet file; a path ending in ``.json`` writes
        the older, much larger JSON format."""
        # NOTE: every table read before writing: a loaded run reads them lazily
        tables = dict(self.tables())
        return runfile.write(path, tables, {**self.meta, **(meta or {})})


class History(_Tables):
    """A live run's step records and the tables built from them; `roofline` (None: NaN) fills the
    steps table's roofline columns."""

    def __init__(self, roofline: Roofline | None = None, other_ranks: Any = None) -> None:
        self.roofline, self.other_ranks = roofline, other_ranks
        self.sessions: list = []  # ended profiler sessions, placed in records when read
        self.records: list[StepRecord] = []
        # uid -> step, seconds, prompt tokens, max tokens, source ("python", "http")
        self.arrivals: dict[int, tuple[int, float, int, int, str]] = {}
        # uid -> (step, seconds, reason): ended where no record carries the finish
        self.aborts: dict[int, tuple[int, float, str]] = {}
        self.meta: dict[str, Any] = {}
        self._cache: dict[str, pd.DataFrame] | None = None
        self._rows = TableRows(roofline)
        # NOTE: a served engine appends from its own thread while a view reads the tables
        self._lock = threading.RLock()

    def arrive(
        self,
        uid: int,
        step: int,
        seconds: float,
        prompt_len: int,
        max_tokens: int,
        source: str = "python",
    ) -> None:
        with self._lock:
            self.arrivals[uid] = (step, seconds, prompt_len, max_tokens, source)
            self._cache = None

    def abort(self, uid: int, step: int, seconds: float, reason: str = "abort") -> None:
        with self._lock:
            self.aborts[uid] = (step, seconds, reason)
            self._cache = None

    def append(self, record: StepRecord) -> None:
        with self._lock:
            self.records.append(record)
            self._cache = None

    def fill_in(self) -> None:
        """Place what reaches records after their step: profiler events, other ranks' times."""
        with self._lock:
            ranks = self.other_ranks
            if ranks is not None and ranks.read_times():
                self._cache = None
            sessions, self.sessions = self.sessions, []
            for session in sessions:
                session.fill()
            placed = ranks is not None and not ranks.session_running and ranks.read_events()
            if sessions or placed:
                self._rows, self._cache = TableRows(self.roofline), None

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> StepRecord:
        self.fill_in()
        return self.records[i]

    def tables(self) -> dict[str, pd.DataFrame]:
        self.fill_in()
        with self._lock:
            # the records were cleared or replaced, or the rows were built with another roofline
            if not self._rows.follows(self.records) or self._rows.roofline is not self.roofline:
                self._rows, self._cache = TableRows(self.roofline), None
            if self._rows.count < len(self.records):
                self._cache = None
            if self._cache is None:
                for rec in self.records[self._rows.count :]:
                    self._rows.add(rec)
                self._cache = self._rows.frames(dict(self.arrivals), dict(self.aborts))
            return self._cache


class RunTables(_Tables):
    """A saved run's tables, read-only; each is read when first asked for."""

    def __init__(self, frames: Mapping[str, pd.DataFrame], meta: dict) -> None:
        self._frames, self.meta = frames, meta

    @classmethod
    def read(cls, path: str | Path):
        """A run saved with `Workbench.save` (Parquet, or the JSON of older runs)."""
        return cls(*runfile.read(path))

    def tables(self) -> Mapping[str, pd.DataFrame]:
        return _WithTiming(self._frames, device_on_host(self))

    def __len__(self) -> int:
        return len(self._frames["steps"])

    def __repr__(self) -> str:
        m = self.meta
        keys = ("run", "model", "device_name", "policy", "max_extend_tokens", "page_size")
        facts = [f"{k}={m[k]!r}" for k in keys if m.get(k) is not None]
        facts += ["simulated"] if m.get("simulated") else []
        name = type(self).__name__
        return f"{name}({len(self)} steps, {len(self.requests)} requests, {', '.join(facts)})"


class _WithTiming(Mapping):
    """A saved run's tables, the timing columns added to an older steps table."""

    def __init__(self, frames: Mapping[str, pd.DataFrame], on_host: bool) -> None:
        self._frames, self._on_host = frames, on_host

    def __getitem__(self, name: str) -> pd.DataFrame:
        frame = self._frames[name]
        if name == "steps" and "span_ms" not in frame:
            frame = add_timing_columns(frame, self._on_host)  # in place: once
        return frame

    def __iter__(self):
        return iter(self._frames)

    def __len__(self) -> int:
        return len(self._frames)

    def __getattr__(self, name: str):  # e.g. `loaded()` of the frames' mapping
        return getattr(self._frames, name)


def _build_tables(
    records: list[StepRecord],
    arrivals: dict,
    aborts: dict,
    roofline: Roofline | None = None,
) -> dict[str, pd.DataFrame]:
    rows = TableRows(roofline)
    for rec in records:
        rows.add(rec)
    return rows.frames(arrivals, aborts)
