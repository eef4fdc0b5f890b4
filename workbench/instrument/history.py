"""The run history: every StepRecord, and tidy pandas tables built from them on demand.

Tables (one DataFrame each):
- ``steps``: one row per step (phase, batch composition by kind, queue, KV pool, timings);
- ``ledger``: one row per (step, request in the batch), lengths after that step;
- ``requests``: one row per request (arrival, first scheduled, first token, finish; TTFT, TPOT);
- ``admissions``: one row per admission decision (admitted, or the reason it waited);
- ``events``: one row per profiler event (record="full");
- ``pages``: the page-table rows of each batch as runs of consecutive KV slots (record="full").

A history saves to one JSON file and loads back (`load_run`) as a read-only `RunHistory` with the
same tables, which every view can show without a model or a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from .record import StepRecord

TABLES = ("steps", "ledger", "requests", "admissions", "events", "pages")

STEP_COLUMNS = [
    "step",
    "phase",
    "batch_size",
    "padded_size",
    "num_tokens",
    "prefill_tokens",
    "chunk_tokens",
    "decode_tokens",
    "padding_tokens",
    "admitted",
    "waiting_reasons",
    "queue_len",
    "running",
    "kv_free",
    "kv_evictable",
    "kv_in_use",
    "kv_total",
    "free_slots",
    "cuda_graph",
    "overlapped",
    "launched_at",
    "completed_at",
    "wall_ms",
    "device_ms",
    "host_ms",
    "wait_ms",
]
LEDGER_COLUMNS = [
    "step",
    "uid",
    "kind",
    "table_idx",
    "cached_len",
    "device_len",
    "max_device_len",
    "extend_len",
    "remain_len",
    "cached_tokens",
    "token",
    "finish",
]
REQUEST_COLUMNS = [
    "uid",
    "prompt_tokens",
    "max_tokens",
    "cached_tokens",
    "completion_tokens",
    "finish_reason",
    "arrival_step",
    "first_scheduled_step",
    "first_token_step",
    "finish_step",
    "arrival_s",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "ttft_s",
    "tpot_s",
]
ADMISSION_COLUMNS = ["step", "uid", "admitted", "reason", "extend_len", "cached_len"]
EVENT_COLUMNS = ["step", "name", "category", "track", "start_us", "duration_us"]
PAGE_COLUMNS = ["step", "uid", "table_idx", "pos_start", "pos_end", "slot_start"]


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
        self._rows = _TableRows()

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
            self._rows, self._cache = _TableRows(), None
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
    rows = _TableRows()
    for rec in records:
        rows.add(rec)
    return rows.frames(arrivals, aborts)


class _TableRows:
    """The tables' rows so far, record by record; a live history keeps one and adds only the
    records that came since its last tables (a view redraws after every step)."""

    def __init__(self) -> None:
        self.count = 0  # records added
        self.last: StepRecord | None = None  # the last of them, to tell a history started over
        self.steps: list[tuple] = []
        self.ledger: list[tuple] = []
        self.admissions: dict[str, list] = {c: [] for c in ADMISSION_COLUMNS}  # by column
        self.events: list[tuple] = []
        self.pages: list[tuple] = []

    def follows(self, records: list[StepRecord]) -> bool:
        """Whether `records` begins with what was added here (else start again)."""
        n = self.count
        return n <= len(records) and (n == 0 or records[n - 1] is self.last)

    def add(self, rec: StepRecord) -> None:
        self.count, self.last = self.count + 1, rec
        by_kind = {"prefill": 0, "chunk": 0, "decode": 0}
        rows = rec.rows  # built on access: once per record
        # NOTE: the decisions straight from the record's storage: a long queue gives a group
        # refusal per step (`_behind`), which goes in as whole columns, not one tuple per row.
        decided, behind = rec._admissions, rec._behind
        _add_admissions(self.admissions, rec.step, decided, behind, rec._behind_reason)
        reasons = {reason for _, admitted, reason, _, _ in decided if not admitted}
        if behind:
            reasons.add(rec._behind_reason)
        for r in rows:
            by_kind[r.kind] += r.extend_len
            self.ledger.append(
                (
                    rec.step,
                    r.uid,
                    r.kind,
                    r.table_idx,
                    r.cached_len,
                    r.device_len,
                    r.max_device_len,
                    r.extend_len,
                    r.max_device_len - r.device_len,
                    r.cached_tokens,
                    r.token,
                    r.finish,
                )
            )
        self.steps.append(
            (
                rec.step,
                rec.phase,
                rec.size,
                rec.padded_size,
                rec.num_tokens,
                by_kind["prefill"],
                by_kind["chunk"],
                by_kind["decode"],
                rec.padded_size - rec.size,
                sum(admitted for _, admitted, _, _, _ in decided),
                ",".join(sorted(reasons)),
                rec.queue_len,
                rec.running,
                rec.kv.free,
                rec.kv.evictable,
                rec.kv.in_use,
                rec.kv.total,
                rec.free_slots,
                rec.cuda_graph,
                rec.overlapped,
                rec.launched_at,
                rec.completed_at,
                rec.wall_ms,
                rec.device_ms,
                rec.host_ms,
                rec.wait_ms,
            )
        )
        for e in rec.events or ():
            self.events.append((rec.step, *e))
        if rec.page_rows:
            for r in rows:
                self.pages.extend(
                    (rec.step, r.uid, r.table_idx, *run)
                    for run in _runs(rec.page_rows[r.table_idx])
                )

    def frames(self, arrivals: dict, aborts: dict) -> dict[str, pd.DataFrame]:
        import pandas as pd

        admissions = self.admissions
        frames = {
            "steps": pd.DataFrame(self.steps, columns=STEP_COLUMNS),
            "ledger": pd.DataFrame(self.ledger, columns=LEDGER_COLUMNS).astype({"token": "Int64"}),
            # (no rows: the same untyped empty table as the others)
            "admissions": pd.DataFrame(
                admissions if admissions["step"] else [], columns=ADMISSION_COLUMNS
            ),
            "events": pd.DataFrame(self.events, columns=EVENT_COLUMNS),
            "pages": pd.DataFrame(self.pages, columns=PAGE_COLUMNS),
        }
        frames["requests"] = _requests_table(frames["steps"], frames["ledger"], arrivals, aborts)
        return {name: _text_as_string(_rounded(frame)) for name, frame in frames.items()}


def _add_admissions(
    columns: dict[str, list], step: int, decided: tuple, behind: tuple, behind_reason: str
) -> None:
    """One step's decisions onto the admissions columns: those made one by one, then the group."""
    for uid, admitted, reason, extend_len, cached_len in decided:
        for name, value in zip(
            ADMISSION_COLUMNS, (step, uid, admitted, reason, extend_len, cached_len)
        ):
            columns[name].append(value)
    n = len(behind)
    if n:
        columns["step"].extend([step] * n)
        columns["uid"].extend(behind)
        columns["admitted"].extend([False] * n)
        columns["reason"].extend([behind_reason] * n)
        columns["extend_len"].extend([0] * n)
        columns["cached_len"].extend([0] * n)


def _rounded(frame: pd.DataFrame) -> pd.DataFrame:
    """Times to the nanosecond: beyond that the digits are noise, and they would not survive a
    save (JSON keeps 15 significant digits), so a loaded run would differ from the live one."""
    decimals = {c: 9 if c.endswith("_s") or c.endswith("_at") else 6 for c in frame.columns}
    floats = [c for c in frame.columns if frame[c].dtype.kind == "f"]
    return frame.round({c: (3 if c.endswith("_us") else decimals[c]) for c in floats})


def _runs(slots) -> list[tuple[int, int, int]]:
    """(pos_start, pos_end, slot_start) for each run of consecutive slots in a page-table row."""
    import numpy as np

    slots = np.asarray(slots, dtype=np.int64)
    if not len(slots):
        return []
    breaks = np.flatnonzero(np.diff(slots) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(slots)]])
    return [(int(a), int(b), int(slots[a])) for a, b in zip(starts, ends)]


def _text_as_string(frame: pd.DataFrame) -> pd.DataFrame:
    """Text columns as pandas' "string" dtype (missing = <NA>), which survives save and load."""
    text = [c for c in frame.columns if frame[c].dtype == object or str(frame[c].dtype) == "str"]
    return frame.astype({c: "string" for c in text}) if text else frame


def _requests_table(
    steps: pd.DataFrame, ledger: pd.DataFrame, arrivals: dict, aborts: dict
) -> pd.DataFrame:
    import pandas as pd

    end_s = dict(zip(steps["step"], steps["completed_at"]))
    start_s = dict(zip(steps["step"], steps["launched_at"]))
    # NOTE: whole-table aggregations (one pass each), not a filter per request: a history of
    # thousands of requests rebuilds this after every step in a live view.
    by_uid = ledger.groupby("uid", sort=False)
    first_step = by_uid["step"].min().to_dict()
    cached_of = by_uid["cached_tokens"].first().to_dict()
    sampled = ledger[ledger["token"].notna()].groupby("uid", sort=False)["step"]
    first_token, counts = sampled.min().to_dict(), sampled.size().to_dict()
    done = ledger[ledger["finish"].notna()].drop_duplicates("uid")
    finish_of = dict(zip(done["uid"], zip(done["finish"], done["step"])))
    rows = []
    for uid, (step, seconds, prompt, max_tokens) in sorted(arrivals.items()):
        first, first_tok = first_step.get(uid), first_token.get(uid)
        count = counts.get(uid, 0)
        fin = finish_of.get(uid)  # (reason, step)
        t_first = end_s.get(first_tok) if first_tok is not None else None
        t_fin = end_s.get(fin[1]) if fin is not None else None
        if fin is None and uid in aborts:  # aborted between steps, or its step failed
            step_ended, t_fin, reason = aborts[uid]
            fin = (reason, step_ended)
        rows.append(
            (
                uid,
                prompt,
                max_tokens,
                int(cached_of.get(uid, 0)),
                count,
                None if fin is None else fin[0],
                step,
                first,
                first_tok,
                None if fin is None else fin[1],
                seconds,
                start_s.get(first) if first is not None else None,
                t_first,
                t_fin,
                None if t_first is None else t_first - seconds,
                (t_fin - t_first) / (count - 1) if t_fin is not None and count > 1 else None,
            )
        )
    frame = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    ints = ["first_scheduled_step", "first_token_step", "finish_step"]
    return frame.astype({c: "Int64" for c in ints} | {c: "float64" for c in REQUEST_COLUMNS[-6:]})
