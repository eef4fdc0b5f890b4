"""StepRecord: one scheduler step, made at launch and completed at collect.

Record N describes batch N: lengths after it computed, and the tokens and finishes it produced.
With overlap, a request that hit EOS in batch N also appears in record N+1 with `token=None`.
"""

from __future__ import annotations

import html
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ..clocks import HOST_STAGES, StageClock
from ..core import Admission, Admissions, ReqView
from ..timing import host_work_ms, is_host_bound

if TYPE_CHECKING:
    import numpy as np

    from ..core import Batch
    from ..engine.engine import Launch

_EXTEND = ReqView._fields.index("extend_len")
_UID = operator.attrgetter("uid")


class LedgerRow(NamedTuple):
    """One request of a batch: its lengths after the step, and what the step did for it."""

    uid: int
    kind: str  # "chunk" | "prefill" | "decode"
    table_idx: int
    cached_len: int
    device_len: int
    max_device_len: int
    extend_len: int  # tokens this step computed for it
    cached_tokens: int  # prompt tokens its admission found in the prefix cache
    token: int | None  # None: a chunk, or past its end
    finish: str | None  # "stop" / "length" if this step produced its last token


class KVState(NamedTuple):
    """The KV pool at the end of the step, in tokens."""

    free: int
    evictable: int  # cached and unlocked
    in_use: int
    total: int


class Occupancy(NamedTuple):
    """The scheduler's resources after a step, as a record keeps them."""

    queue_len: int
    running: int
    free_slots: int
    kv_free: int
    kv_evictable: int
    kv_total: int


_NO_KV = KVState(0, 0, 0, 0)


@dataclass(eq=False)
class StepRecord:
    step: int
    phase: str  # "prefill" | "decode" | "mixed"
    # NOTE: per-request facts are plain tuples (one per ReqView field), not a named tuple per
    # request: the garbage collector stops tracking plain tuples after one pass.
    _launched: tuple[tuple, ...] = field(default=(), repr=False)
    _tokens: tuple[int | None, ...] = field(default=(), repr=False)
    _finishes: tuple[tuple[int, str], ...] = field(default=(), repr=False)  # (uid, reason)
    _admissions: tuple[tuple, ...] = field(default=(), repr=False)
    _behind: tuple[int, ...] = field(default=(), repr=False)
    _behind_reason: str = field(default="", repr=False)
    queue_len: int = 0
    running: int = 0
    kv: KVState = _NO_KV
    free_slots: int = 0
    padded_size: int = 0  # requests as run (a CUDA graph's batch is padded to its shape)
    cuda_graph: bool = False
    overlapped: bool = False  # the next batch was launched before this one completed
    launched_at: float = 0.0  # seconds since the run started
    completed_at: float = 0.0
    device_ms: float = 0.0  # forward and sampling (CUDA events; wall time on the CPU)
    host_ms: float = 0.0
    wait_ms: float = 0.0  # host blocked on the device for the tokens
    host_stage_ms: tuple[float, ...] = ()  # in `clocks.HOST_STAGES` order
    tp_size: int = 1
    simulated: bool = False  # timed by a twin's step costs, not measured
    device_on_host: bool = False
    padded_tokens: int = 0  # tokens as run, padding included (0: not known)
    # an MoE model's routing: per MoE layer (the decoder layers `moe_layers`), the tokens each
    # expert received, a graph's padding not counted (int32 [MoE layers, experts]; None: dense)
    routing: np.ndarray | None = field(default=None, repr=False)
    moe_layers: tuple[int, ...] = ()
    # filled when the history is read: ranks 1..'s device_ms, events and clock offsets (ms)
    rank_device_ms: list[float] | None = field(default=None, repr=False)
    # record="full": table row -> (since, slot runs gained this step); see `History.pages_at`
    page_rows: dict[int, tuple[int, tuple[tuple[int, int, int], ...]]] | None = None
    # record="full": (name, category, track, start_us, duration_us), filled when profiling ends
    events: list[tuple] | None = field(default=None, repr=False)
    # record="full": a profiler session ended in this step, before its launch (the step is not
    # profiled): the host time stopping it took (0: none ended here)
    profiler_stop_ms: float = 0.0
    rank_events: list[tuple[int, list[tuple]]] | None = field(default=None, repr=False)
    rank_clock_ms: list[float] | None = field(default=None, repr=False)
    # live while the step runs; let go by `complete`
    batch: Batch | None = field(default=None, repr=False)
    launch: Launch | None = field(default=None, repr=False)
    stages: StageClock | None = field(default=None, repr=False)
    _admitted: Admissions | None = field(default=None, repr=False)
    _previous: Batch | None = field(default=None, repr=False)

    @classmethod
    def launched(
        cls,
        step: int,
        batch: Batch,
        admissions: Admissions,
        launch: Launch,
        launched_at: float,
        stages: StageClock,
        previous: Batch | None,
    ) -> StepRecord:
        return cls(
            step,
            batch.phase,
            padded_size=launch.padded_rows,
            padded_tokens=launch.padded_tokens,
            cuda_graph=launch.cuda_graph,
            launched_at=launched_at,
            tp_size=launch.tp_size,
            device_on_host=not getattr(launch.timer, "cuda", True),
            moe_layers=launch.moe_layers,
            batch=batch,
            launch=launch,
            stages=stages,
            _admitted=admissions,
            _previous=previous,
        )

    def collected(
        self,
        tokens: list[int | None],
        finishes: list[tuple[int, str]],
        completed_at: float,
        wait_ms: float,
        occupancy: Occupancy,
    ) -> None:
        """What collecting the batch found: tokens, finishes, and resources after it."""
        o = occupancy
        self._tokens, self._finishes = tuple(tokens), tuple(finishes)
        self.completed_at, self.wait_ms = completed_at, wait_ms
        self.queue_len, self.running, self.free_slots = o.queue_len, o.running, o.free_slots
        in_use = o.kv_total - o.kv_free - o.kv_evictable
        self.kv = KVState(o.kv_free, o.kv_evictable, in_use, o.kv_total)

    def simulate(self, host_stage_ms: tuple[float, ...]) -> None:
        """A twin's step: host stages as predicted, not as measured."""
        self.simulated, self.device_on_host = True, False
        self.host_stage_ms, self.host_ms = host_stage_ms, sum(host_stage_ms)

    def complete(self) -> StepRecord:
        """Read the live batch, launch and stage clock into plain values and let them go."""
        batch = self.batch
        if batch is None:
            return self
        self._launched = batch.launched_columns(like=self._previous)
        admitted = self._admitted
        self._admissions = tuple(map(tuple, admitted.decided))
        self._behind = tuple(map(_UID, admitted.behind))
        self._behind_reason = admitted.behind_reason
        if self.launch is not None and self.launch.timer is not None:
            self.device_ms = self.launch.timer.elapsed_ms()
        if self.launch is not None and self.launch.routing is not None:
            self.routing = self.launch.host_routing().copy()  # NOTE: off the pinned buffer
        if self.stages is not None and not self.simulated:
            self.stages.enter(None)
            self.host_stage_ms = self.stages.host_ms()
            self.host_ms = sum(self.host_stage_ms)
        self.batch = self.launch = self.stages = self._admitted = self._previous = None
        return self

    @property
    def events_by_rank(self) -> list[tuple[int, list[tuple]]]:
        """Every rank's events of the step, rank 0's first: (rank, its events) pairs."""
        return [(0, self.events or []), *(self.rank_events or ())]

    @property
    def rows(self) -> tuple[LedgerRow, ...]:
        """One row per request of the batch, with its lengths after the step."""
        self.complete()
        launched = [ReqView._make(r) for r in zip(*self._launched)]
        sampled = [r.uid for r in launched if r.kind != "chunk"]
        token_of, finish_of = dict(zip(sampled, self._tokens)), dict(self._finishes)
        return tuple(
            LedgerRow(
                r.uid,
                r.kind,
                r.table_idx,
                r.device_len,
                r.device_len + 1,
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
        """(decisions as plain `Admission` tuples, uids refused as a group, their reason)."""
        self.complete()
        return self._admissions, self._behind, self._behind_reason

    @property
    def admissions(self) -> tuple[Admission, ...]:
        """The step's admission decisions: admitted, or why a request waits."""
        self.complete()
        behind = (Admission(uid, False, self._behind_reason, 0, 0) for uid in self._behind)
        return (*(Admission._make(a) for a in self._admissions), *behind)

    @property
    def size(self) -> int:
        return self.batch.size if self.batch is not None else len(self._launched[0])

    @property
    def tokens(self) -> tuple[int | None, ...]:
        """The token sampled per sampled request, in batch order (None: past its end)."""
        return self._tokens

    def stage_ms(self) -> dict[str, float]:
        """Host milliseconds by stage (`clocks.HOST_STAGES`), also before `complete`."""
        if self.stages is not None and not self.simulated:
            return {stage: self.stages.ms[stage] for stage in HOST_STAGES}
        return dict(zip(HOST_STAGES, self.host_stage_ms))

    @property
    def num_tokens(self) -> int:
        self.complete()
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
        """The host's own work, the device's left out (`workbench.timing`)."""
        self.complete()
        return host_work_ms(self.host_ms, self.device_ms, self.device_on_host)

    @property
    def host_bound(self) -> bool:
        """Whether the host's own work took longer than the device's (`workbench.timing`)."""
        self.complete()
        return is_host_bound(self.host_ms, self.device_ms, self.device_on_host)

    @property
    def uids(self) -> tuple[int, ...]:
        self.complete()
        return self._launched[0]

    @property
    def finished(self) -> tuple[int, ...]:
        return tuple(uid for uid, _ in self._finishes)

    @property
    def rejected(self) -> tuple[Admission, ...]:
        return tuple(a for a in self.admissions if not a.admitted)

    def to_pandas(self):
        """The batch's ledger rows as a DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=LedgerRow._fields)

    def summary(self) -> str:
        kinds = {}
        for r in self.rows:
            kinds[r.kind] = kinds.get(r.kind, 0) + r.extend_len
        parts = ", ".join(f"{n} {k}" for k, n in kinds.items())
        return (
            f"step {self.step} · {self.phase} · {self.size} request{'s' * (self.size != 1)} · "
            f"{self.num_tokens} token{'s' * (self.num_tokens != 1)} "
            f"({parts}) · queue {self.queue_len} · KV free {self.kv.free}/{self.kv.total}"
        )

    def __repr__(self) -> str:
        return f"StepRecord({self.summary()})"

    def _repr_html_(self) -> str:
        # NOTE: plain HTML and inline styles, so it renders in static notebook exports too.
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
        """Wall, device and host's own time in one line, and "host-bound" when it was."""
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
