"""What a workbench gives back: the finished requests, their texts, the run saved or snapshot,
the trace, the dashboard and the report (the `Workbench`'s part that reads, a mixin)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .runs import RunHistory

if TYPE_CHECKING:
    from .arrivals import Arrivals
    from .llm import LLM
    from .scheduler import Scheduler


class Results:
    """A `Workbench`'s results and views (it provides `llm`, `scheduler`, `history` and the
    requests due to arrive)."""

    llm: LLM
    scheduler: Scheduler
    _arrivals: Arrivals

    def outputs(self) -> list[dict]:
        """The finished requests, as `LLM.generate` returns them, by uid."""
        return [self.llm.output(req) for _, req in sorted(self.scheduler.finished.items())]

    def save(self, path: str | Path) -> Path:
        """The run's tables, settings and each request's prompt and answer, in one file."""
        return self.history.save(path, self.run_meta())

    def run_meta(self) -> dict:
        """What a saved run carries with its tables: the settings, and each request's prompt
        and answer."""
        return {**self.llm.run_meta(), "texts": self.texts()}

    def texts(self) -> dict[str, list[str]]:
        """Each request's prompt and answer so far, as text, by uid (a string: JSON keys):
        the running and finished ones, those waiting and those due to arrive."""
        sched, decode = self.scheduler, self.llm.decode
        reqs = {**{r.uid: r for r in sched.live_reqs}, **sched.finished}
        out = {
            uid: [decode(r.token_ids[: r.prompt_len]), decode(r.token_ids[r.prompt_len :])]
            for uid, r in reqs.items()
        }
        # the queue's own copy of a prompt is whole (a chunk's ledger holds what it computed)
        waiting = [(p.uid, p.token_ids) for p in sched.prefill.queue]
        waiting += [(due.uid, due.ids) for due in self._arrivals]
        out |= {uid: [decode(ids), ""] for uid, ids in waiting}
        return {str(uid): out[uid] for uid in sorted(out)}

    def export_trace(self, path: str | Path) -> Path:
        """Chrome trace JSON of the run (steps; profiler events with record="full"; which
        steps were profiled and, in its `otherData`, the settings and what chose them)."""
        from .history.trace import export_trace

        history = self.history
        return export_trace(history.steps, history.events, path, self.llm.run_meta())

    def snapshot(self, **meta: Any) -> RunHistory:
        """The run so far as a `RunHistory` (what `load_run` gives for a saved run): its tables
        stay as they are when the workbench goes on or is reset. `meta` is added to its meta."""
        return RunHistory(dict(self.history.tables()), {**self.run_meta(), **meta})

    def dashboard(self):
        """An ipywidgets layout: Step / Step x N / Run / Reset, a step slider, a request picker,
        and charts that redraw after every step (also steps taken from other cells)."""
        from .viz.dashboard import Dashboard

        return Dashboard(self)

    def report(self, path: str | Path, title: str | None = None) -> Path:
        """One self-contained HTML file: summary, every chart, the request table with each
        prompt and answer (no network)."""
        from .viz.report import write_report

        return write_report(self.history, path, title=title, meta=self.run_meta())
