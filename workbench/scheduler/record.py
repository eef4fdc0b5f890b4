"""StepRecord: what one scheduler step did, frozen, in CPU values.

Launched against completed. A step's batch is *launched* (scheduled, prepared, forward and
sampling enqueued, device-side ledgers moved) and later *completed* (its sampled tokens reach the
host and are processed). The record of step N describes batch N: `rows` give every request's
lengths *after* batch N computed (what batch N launched with, plus one step of progress), and the
tokens and finishes that batch N produced. Without overlap, batch N+1 is launched after batch N
completed. With overlap, batch N+1 was already launched when batch N completed: `overlapped` is
True, and a request that hit EOS in batch N also appears in record N+1 with `token=None` (its
extra token is dropped). Attribution never shifts: every length and token belongs to the step
that computed it.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ..core import Admission, ReqView
from .timing import host_work_ms, is_host_bound

if TYPE_CHECKING:
    from ..core import Batch
    from ..scheduler.outcome import Occupancy, StepOutcome

_EXTEND = ReqView._fields.index("extend_len")


class LedgerRow(NamedTuple):
    """One request of a batch: its lengths after the step, and what the step did for it."""

    uid: int
    kind: str  # "chunk" | "prefill" | "decode"
    table_idx: int
    cached_len: int  # after the step: tokens whose KV is in the pool
    device_len: int  # after the step
    max_device_len: int
    extend_len: int  # tokens this step computed for it
    cached_tokens: int  # prompt tokens its admission found in the prefix cache
    token: int | None  # the token this step sampled for it (None: a chunk, or past its end)
    finish: str | None  # "stop" / "length" if this step produced its last token


class KVState(NamedTuple):
    """The KV pool at the end of the step, in tokens."""

    free: int
    evictable: int  # cached and unlocked: free once evicted
    in_use: int  # held by live requests (cached pages locked by them included)
    total: int


@dataclass(frozen=True)
class StepRecord:
    step: int
    phase: str  # "prefill" | "decode" | "mixed"
    # NOTE: per-request facts are kept as plain tuples of ints and strings, and `rows` and
    # `admissions` are built from them on each access. The garbage collector stops tracking such
    # tuples after one pass; a named tuple it tracks for ever, and a run of 1,000 steps x 256
    # requests then made one full collection cost 0.3 s on the H200 machine (6% of the run).
    # the batch as launched: one tuple per ReqView field, each with one value per request
    _launched: tuple[tuple, ...] = field(repr=False)
    _tokens: tuple[int | None, ...] = field(repr=False)  # per non-chunk row, in order
    _finishes: tuple[tuple[int, str], ...] = field(repr=False)  # (uid, reason) finished here
    _admissions: tuple[tuple, ...] = field(repr=False)  # Admission fields, in decision order
    _behind: tuple[int, ...] = field(repr=False)  # uids refused as a group, after the others
    _behind_reason: str = field(repr=False)  # why they were: queued_behind or decode_first
    queue_len: int  # requests waiting after the step
    running: int  # requests in the running set after the step
    kv: KVState
    free_slots: int  # request slots free after the step
    padded_size: int  # requests as run (a CUDA graph's batch is padded to its shape)
    cuda_graph: bool
    overlapped: bool  # the next batch was launched before this one completed
    launched_at: float  # seconds since the run started
    completed_at: float
    device_ms: float  # forward and sampling on the device (CUDA events; wall time on the CPU)
    host_ms: float = 0.0  # host work: schedule, prepare, enqueue, process the tokens, record
    wait_ms: float = 0.0  # host blocked on the device for the tokens (near 0: host-bound)
    # host_ms by stage, in `stages.HOST_STAGES` order (schedule, prepare, plan, forward, ...)
    host_stage_ms: tuple[float, ...] = ()
    tp_size: int = 1  # processes the step's forward ran on (tensor parallelism)
    simulated: bool = False  # timed by a twin's step costs (`workbench.twin`), not measured
    device_on_host: bool = False  # the forward ran on the host's cores (a CPU engine)
    padded_tokens: int = 0  # tokens as run, padding included (0: not known, a padded row each)
    # tensor parallelism: device_ms of ranks 1.. (rank 0's is device_ms), filled when the
    # history is read (`Probe.read_events`)
    rank_device_ms: list[float] | None = field(default=None, repr=False)
    # record="full": table row -> (since, runs): the slot runs (pos_start, pos_end, slot_start)
    # the row gained in this step, its runs listed since step `since` (`History.pages_at`
    # gives a step's rows whole)
    page_rows: dict[int, tuple[int, tuple[tuple[int, int, int], ...]]] | None = None
    # record="full": profiler events (name, category, track, start_us, duration_us); filled in
    # when the profiler session that covered the step ends (`Probe.flush`)
    events: list[tuple] | None = field(default=None, repr=False)
    # record="full", tensor parallelism: the other ranks' events of the step on rank 0's clock,
    # (rank, its events) pairs, and what moved ranks 1..'s clocks onto it (ms,
    # `history.rank_clock`); filled when the history is read
    rank_events: list[tuple[int, list[tuple]]] | None = field(default=None, repr=False)
    rank_clock_ms: list[float] | None = field(default=None, repr=False)

    @property
    def events_by_rank(self) -> list[tuple[int, list[tuple]]]:
        """Every rank's events of the step, rank 0's first: (rank, its events) pairs."""
        return [(0, self.events or []), *(self.rank_events or ())]

    @property
    def rows(self) -> tuple[LedgerRow, ...]:
        """One row per request of the batch, with its lengths after the step."""
        launched = [ReqView._make(r) for r in zip(*self._launched)]
        sampled = [r.uid for r in launched if r.kind != "chunk"]
        token_of, finish_of = dict(zip(sampled, self._tokens)), dict(self._finishes)
        return tuple(
            LedgerRow(
                r.uid,
                r.kind,
                r.table_idx,
                r.device_len,  # after the step: what it computed is cached ...
                r.device_len + 1,  # ... and one more token is known to the device
                r.max_device_len,
                r.extend_len,
                r.cached_tokens,
                token_of.get(r.uid),
                finish_of.get(r.uid),
            )
            for r in launched
        )

    @property
    def admission_parts(self) -> tuple[tuple[tuple, ...], tuple[int, ...], str]:
        """The admissions as kept: the decisions made one by one (`Admission` fields, as plain
        tuples), the uids refused as a group after them, and why they were (what the tables
        read: a queue of thousands is not turned into thousands of named tuples)."""
        return self._admissions, self._behind, self._behind_reason

    @property
    def admissions(self) -> tuple[Admission, ...]:
        """The step's admission decisions: admitted, or why a request waits."""
        behind = (Admission(uid, False, self._behind_reason, 0, 0) for uid in self._behind)
        return (*(Admission._make(a) for a in self._admissions), *behind)

    @property
    def size(self) -> int:
        return len(self._launched[0])

    @property
    def num_tokens(self) -> int:
        return sum(self._launched[_EXTEND])

    @property
    def padding_tokens(self) -> int:
        """The tokens run beyond those computed (a padded graph's shape)."""
        if self.padded_tokens:
            return self.padded_tokens - self.num_tokens
        return self.padded_size - self.size

    @property
    def wall_ms(self) -> float:
        return (self.completed_at - self.launched_at) * 1e3

    @property
    def host_work_ms(self) -> float:
        """The host's own work, the device's left out (`history.timing`)."""
        return host_work_ms(self.host_ms, self.device_ms, self.device_on_host)

    @property
    def host_bound(self) -> bool:
        """Whether the host's own work took longer than the device's (`history.timing`)."""
        return is_host_bound(self.host_ms, self.device_ms, self.device_on_host)

    @property
    def uids(self) -> tuple[int, ...]:
        return self._launched[0]

    @property
    def finished(self) -> tuple[int, ...]:
        return tuple(uid for uid, _ in self._finishes)  # in batch order, as collected

    @property
    def rejected(self) -> tuple[Admission, ...]:
        return tuple(a for a in self.admissions if not a.admitted)

    def to_pandas(self):
        """The batch's ledger rows as a DataFrame (one row per request)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=LedgerRow._fields)

    def summary(self) -> str:
        kinds = {}
        for r in self.rows:
            kinds[r.kind] = kinds.get(r.kind, 0) + r.extend_len
        parts = ", ".join(f"{n} {k}" for k, n in kinds.items())
        return (
            f"step {self.step} · {self.phase} · {self.size} requests · {self.num_tokens} tokens "
            f"({parts}) · queue {self.queue_len} · KV free {self.kv.free}/{self.kv.total}"
        )

    def __repr__(self) -> str:
        return f"StepRecord({self.summary()})"

    def _repr_html_(self) -> str:
        """One line (the step, its batch, its times), the ledger folded under it (a click shows
        it; `to_pandas()` gives it as a table): plain HTML and inline styles, so it renders in
        any notebook front end and in static exports (no widgets, no scripts)."""
        cell = "padding:2px 8px;border-bottom:1px solid #ddd;text-align:right"
        head = "".join(
            f'<th style="{cell}">{h}</th>'
            for h in (
                "uid",
                "kind",
                "cached_len",
                "device_len",
                "max_device_len",
                "extend_len",
                "cached_tokens",
                "table_idx",
                "token",
                "finish",
            )
        )
        from ..palette import KIND_COLORS

        body = []
        for r in self.rows:
            kind = f'<span style="color:{KIND_COLORS.get(r.kind, "#000")}">{r.kind}</span>'
            values = (
                r.uid,
                kind,
                r.cached_len,
                r.device_len,
                r.max_device_len,
                r.extend_len,
                r.cached_tokens,
                r.table_idx,
                "" if r.token is None else r.token,
                r.finish or "",
            )
            body.append("<tr>" + "".join(f'<td style="{cell}">{v}</td>' for v in values) + "</tr>")
        waits = ", ".join(f"#{a.uid}: {a.reason}" for a in self.rejected[:8])
        more = f" (+{len(self.rejected) - 8})" if len(self.rejected) > 8 else ""
        waiting = f"<div>waiting: {html.escape(waits)}{more}</div>" if waits else ""
        rows = "request" if self.size == 1 else "requests"
        return (
            f'<div style="font-family:monospace;font-size:12px">'
            f"<b>{html.escape(self.summary())}</b> · {html.escape(self.timing())}"
            f"<details><summary>ledger of {self.size} {rows}</summary>{waiting}"
            f'<table style="border-collapse:collapse"><tr>{head}</tr>{"".join(body)}</table>'
            "</details></div>"
        )

    def timing(self) -> str:
        """ "8.2 ms wall, 6.1 ms device, host's own work 1.9 ms" (`history.timing`; on the CPU
        the device's work is the forward and sampling), and "host-bound" when it was."""
        device = "forward and sampling" if self.device_on_host else "device"
        said = f"{self.wall_ms:.1f} ms wall, {self.device_ms:.1f} ms {device}, "
        said += f"host's own work {self.host_work_ms:.1f} ms"
        return said + (", host-bound" if self.host_bound else "")


class StepRecords(list):
    """The records of the steps a call ran (`Workbench.run`): a list, shown as one line."""

    def summary(self) -> str:
        if not self:
            return "no steps: nothing was waiting or running"
        phases: dict[str, int] = {}
        for record in self:
            phases[record.phase] = phases.get(record.phase, 0) + 1
        kinds = ", ".join(f"{n} {phase}" for phase, n in phases.items())
        finished = sum(len(record.finished) for record in self)
        first, last = self[0], self[-1]
        seconds = last.completed_at - first.launched_at
        steps = "step" if len(self) == 1 else "steps"
        return (
            f"{len(self)} {steps} ({first.step}-{last.step}: {kinds}) in {seconds:.2f} s, "
            f"{finished} requests finished; the records: wb.history"
        )

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return (
            f'<div style="font-family:monospace;font-size:12px">{html.escape(self.summary())}</div>'
        )


def build_record(
    outcome: StepOutcome,
    occupancy: Occupancy,
    events: list | None = None,
    rank_device_ms: list | None = None,
    began: float | None = None,
    last: Batch | None = None,
    predicted_host_ms: tuple[float, ...] | None = None,
    rank_events: tuple[list, list] | None = None,
) -> StepRecord:
    """The step's record. `began`: when recording it began (`time.perf_counter()`); the host
    time counts until the record is built, its stages by the batch's clock. `last`: the
    batch recorded before (its columns are shared where they are the same).
    `predicted_host_ms`: a simulated step's host stages as a twin predicted them (in
    `HOST_STAGES` order); its record says it was simulated."""
    launched, o = outcome.launched, occupancy
    in_use = o.kv_total - o.kv_free - o.kv_evictable
    columns = outcome.batch.launched_columns(like=last)
    admissions = tuple([tuple(a) for a in outcome.admissions.decided])
    device_ms = launched.device.timer.elapsed_ms()
    launched.clock.enter(None)  # what is left (the frozen record itself) is a few microseconds
    record_ms = 0.0 if began is None else (time.perf_counter() - began) * 1e3
    host_ms = launched.launch_ms + outcome.collect_ms + record_ms
    host_stage_ms = launched.clock.host_ms()
    if predicted_host_ms is not None:
        host_ms, host_stage_ms = sum(predicted_host_ms), predicted_host_ms
    return StepRecord(
        step=outcome.index,
        phase=outcome.batch.phase,
        _launched=columns,
        _tokens=tuple(outcome.tokens),
        _finishes=tuple((req.uid, req.finish_reason) for req in outcome.finished),
        _admissions=admissions,
        _behind=tuple([p.uid for p in outcome.admissions.behind]),
        _behind_reason=outcome.admissions.behind_reason,
        queue_len=o.queue_len,
        running=o.running,
        kv=KVState(free=o.kv_free, evictable=o.kv_evictable, in_use=in_use, total=o.kv_total),
        free_slots=o.free_slots,
        padded_size=launched.padded_size,
        padded_tokens=launched.padded_tokens,
        cuda_graph=launched.cuda_graph,
        overlapped=launched.overlapped,
        launched_at=launched.launched_at,
        completed_at=outcome.completed_at,
        device_ms=device_ms,
        host_ms=host_ms,
        wait_ms=outcome.wait_ms,
        host_stage_ms=host_stage_ms,
        tp_size=launched.device.tp_size,
        simulated=predicted_host_ms is not None,
        # a CPU engine's timer is the wall clock around the forward it ran itself
        device_on_host=predicted_host_ms is None
        and not getattr(launched.device.timer, "cuda", True),
        page_rows=launched.page_rows,
        events=events,
        rank_device_ms=rank_device_ms,
        rank_events=None if rank_events is None else rank_events[0],
        rank_clock_ms=None if rank_events is None else rank_events[1],
    )
