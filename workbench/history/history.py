"""The run history: every StepRecord, and tidy pandas tables built from them on demand.

Tables (one DataFrame each):
- ``steps``: one row per step (phase, batch composition by kind, queue, KV pool, timings);
- ``ledger``: one row per (step, request in the batch), lengths after that step;
- ``requests``: one row per request (arrival, first scheduled, first token, finish; TTFT, TPOT);
- ``admissions``: one row per admission decision (admitted, or the reason it waited);
- ``events``: one row per profiler event (record="full");
- ``pages``: what each batch's page-table rows gained, as runs of consecutive KV slots
  (record="full"); ``pages_at(step)`` gives a step's rows whole.

Each table's columns are the fields of its row type in `tables.py`.

A history saves to one file (Parquet, or the older JSON for a path ending in ``.json``; see
`runfile.py`) and loads back from either as read-only `RunTables` with the same tables, which
every view can show without a model or a GPU (`workbench.load_run` adds the views).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..timing import add_timing_columns, device_on_host
from . import runfile
from .pages import pages_at
from .tables import TableRows

if TYPE_CHECKING:
    import pandas as pd

    from ..scheduler.record import StepRecord
    from .roofline import StepCost

TABLES = ("steps", "ledger", "requests", "admissions", "events", "pages")


class _Tables:
    """The table accessors shared by a live History and a loaded RunHistory."""

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

    def pages_at(self, step: int) -> pd.DataFrame:
        """The page-table rows of step `step`'s batch, whole: each row's maximal runs of
        consecutive KV slots (step, uid, table_idx, pos_start, pos_end, slot_start)."""
        return pages_at(self.pages, step)

    def save(self, path: str | Path, meta: dict | None = None) -> Path:
        """Write every table (and `meta`) to one file: Parquet (zstd, each table readable alone,
        see `runfile.py`) whatever the suffix, except a path ending in ``.json``, which writes the
        older JSON format (``workbench-run/1``) for tools that want JSON: ten to thirty times
        larger for a profiled run, and slower to write and to load."""
        # every table read before the file is written (a loaded run reads them lazily)
        tables = dict(self.tables())
        return runfile.write(path, tables, {**self.meta, **(meta or {})})


class History(_Tables):
    def __init__(self, cost: StepCost | None = None, other_ranks: Any = None) -> None:
        """`cost`: the roofline of the engine's steps, for the steps table's `bytes_read`,
        `flops`, `bound_ms` and `achieved_gbps` (None: those columns are NaN).
        `other_ranks`: with tensor parallelism, what ranks 1.. report of the steps
        (`instrument.other_ranks.OtherRanks`), asked for when the history is read."""
        self.cost, self.other_ranks = cost, other_ranks
        # ended profiler sessions whose events go to their steps' records when the history is
        # read (`instrument.profiler.SessionEvents`)
        self.sessions: list = []
        self.records: list[StepRecord] = []
        # uid -> step, seconds, prompt tokens, max tokens, source ("python", "http")
        self.arrivals: dict[int, tuple[int, float, int, int, str]] = {}
        # uid -> (step it ended before, seconds, reason): ended between steps ("abort") or by a
        # step that failed ("error"), so no record carries its finish
        self.aborts: dict[int, tuple[int, float, str]] = {}
        self.meta: dict[str, Any] = {}
        self._cache: dict[str, pd.DataFrame] | None = None
        self._rows = TableRows(cost)
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
        """What reaches records after their step: the events of ended profiler sessions and,
        with tensor parallelism, the other ranks' device times and events (in place, in the
        lists the records hold); the tables that show them are built again."""
        with self._lock:
            ranks = self.other_ranks
            if ranks is not None and ranks.read_times():
                self._cache = None  # (the rows hold the records' lists)
            sessions, self.sessions = self.sessions, []
            for session in sessions:
                session.fill()
            placed = ranks is not None and not ranks.session_running and ranks.read_events()
            if sessions or placed:
                self._rows, self._cache = TableRows(self.cost), None

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> StepRecord:
        self.fill_in()
        return self.records[i]

    def tables(self) -> dict[str, pd.DataFrame]:
        self.fill_in()
        with self._lock:
            # the records were cleared or replaced, or the rows were built with another cost
            if not self._rows.follows(self.records) or self._rows.cost is not self.cost:
                self._rows, self._cache = TableRows(self.cost), None
            if self._rows.count < len(self.records):
                self._cache = None
            if self._cache is None:
                for rec in self.records[self._rows.count :]:
                    self._rows.add(rec)
                self._cache = self._rows.frames(dict(self.arrivals), dict(self.aborts))
            return self._cache


class RunTables(_Tables):
    """A saved run's tables, read-only, no engine behind them. From a Parquet file each table is
    read the first time it is asked for (`runfile.ParquetTables`). `workbench.load_run` gives
    one with its views (`RunHistory`: `dashboard()`, `report()`)."""

    def __init__(self, frames: Mapping[str, pd.DataFrame], meta: dict) -> None:
        self._frames, self.meta = frames, meta

    @classmethod
    def read(cls, path: str | Path):
        """A run saved with `Workbench.save` (or `History.save`): a Parquet file (told by its
        first bytes, whatever its name) or the JSON of older runs."""
        return cls(*runfile.read(path))

    def tables(self) -> Mapping[str, pd.DataFrame]:
        return _WithTiming(self._frames, device_on_host(self))

    def __len__(self) -> int:
        return len(self._frames["steps"])

    def __repr__(self) -> str:
        """One line: its size and the settings that tell runs apart (all of them: `meta`)."""
        m = self.meta
        keys = ("run", "model", "device_name", "policy", "max_extend_tokens", "page_size")
        facts = [f"{k}={m[k]!r}" for k in keys if m.get(k) is not None]
        facts += ["simulated"] if m.get("simulated") else []
        name = type(self).__name__
        return f"{name}({len(self)} steps, {len(self.requests)} requests, {', '.join(facts)})"


class _WithTiming(Mapping):
    """A saved run's tables, its steps table with the timing columns (`timing.py`) added when
    it was saved before them; the other tables as they are (read when first asked for)."""

    def __init__(self, frames: Mapping[str, pd.DataFrame], on_host: bool) -> None:
        self._frames, self._on_host = frames, on_host

    def __getitem__(self, name: str) -> pd.DataFrame:
        frame = self._frames[name]
        if name == "steps" and "span_ms" not in frame:
            frame = add_timing_columns(frame, self._on_host)  # once: the frame keeps them
        return frame

    def __iter__(self):
        return iter(self._frames)

    def __len__(self) -> int:
        return len(self._frames)

    def __getattr__(self, name: str):  # what the frames' own mapping offers (`loaded()`)
        return getattr(self._frames, name)


def _build_tables(
    records: list[StepRecord],
    arrivals: dict,
    aborts: dict,
    cost: StepCost | None = None,
) -> dict[str, pd.DataFrame]:
    rows = TableRows(cost)
    for rec in records:
        rows.add(rec)
    return rows.frames(arrivals, aborts)
