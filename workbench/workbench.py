"""Workbench: the engine and scheduler driven step by step, with a record of every step.

    wb = Workbench("smollm2")
    uid = wb.add_request("The capital of France is", SamplingParams(max_tokens=8))
    record = wb.step()          # one scheduler step; a StepRecord (renders as a table)
    wb.run()                    # to the end, with a progress bar
    wb.history.ledger           # pandas tables: steps, ledger, requests, admissions, events
    wb.save("run.json")         # load_run("run.json") shows it again, no model needed

Overlap is off by default so that a step's batch launches after the previous one completed; a
twin (`step_costs=`) has its runs' overlap unless told, as it predicts the engine they ran on.
The run's clock runs only while the workbench steps.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import validate as V
from .arrivals import Arrivals, Due
from .compare_inputs import checked_requests, checked_settings
from .core import SamplingParams
from .instrument.hooks import HookRegistry
from .llm import LLM, Prompt
from .runs import RunHistory
from .scheduler.record import StepRecord, StepRecords
from .serve import MAX_QUEUED_REQUESTS, Host, Server
from .serve.views import ViewThread
from .traces import Trace


class Workbench:
    """An `LLM` stepped by hand (see the module); every keyword goes to `LLM`."""

    def __init__(
        self,
        model: str = "smollm2",
        *,
        record: str = "light",
        overlap: bool | None = None,
        **options: Any,
    ) -> None:
        if overlap is None and options.get("step_costs") is None:
            overlap = False  # (a twin's None: `twin_settings` gives it its runs')
        self.llm = LLM(model, record=record, overlap=overlap, **options)
        self.scheduler = self.llm.scheduler
        self.engine = self.llm.engine
        self.tokenizer = self.llm.tokenizer
        self.config = self.llm.config
        self._arrivals = Arrivals()  # requests added ahead of their arrival
        # what reset(again=True) adds again: this run's requests, else the previous run's
        self._submitted: list[tuple[list[int], SamplingParams, int, float | None]] = []
        self._previous: list[tuple[list[int], SamplingParams, int, float | None]] = []
        self._observers: list[Callable[[bool], None]] = []
        self._views: ViewThread | None = None
        self._notifying = threading.RLock()
        # NOTE: the clock is paused between calls: the time between two cells is not the run's
        self._clock_at_zero()

    def _clock_at_zero(self) -> None:
        """A new run's clock reads 0 until its first step: building the engine is not run time
        (a request due at 2 ms was due on arrival where the build took 2 ms)."""
        clock = self.scheduler.clock
        clock.pause()
        clock.restart()

    @property
    def hooks(self) -> HookRegistry:
        return self.llm.hooks

    @property
    def history(self):
        return self.llm.history

    @property
    def step_index(self) -> int:
        """The index the next step will have."""
        return self.scheduler.step_index

    @property
    def is_done(self) -> bool:
        return self.scheduler.is_idle and not self._arrivals

    def add_request(
        self,
        prompt: Prompt,
        sampling: SamplingParams | None = None,
        arrival_step: int | None = None,
        arrival_time: float | None = None,
    ) -> int:
        """Queue a request, arriving now, at `arrival_step` or at `arrival_time` seconds."""
        self.llm.check_open()
        with self._engine_held():
            uid = self._add_request(prompt, sampling, arrival_step, arrival_time)
        self._notify(final=False)
        return uid

    def _add_request(self, prompt, sampling, arrival_step, arrival_time) -> int:
        sampling = sampling if sampling is not None else SamplingParams()
        arrival_step = V.optional_integer("arrival_step", arrival_step, 0)
        if arrival_time is not None:
            arrival_time = V.real("arrival_time", arrival_time, 0.0)
            if arrival_step is not None:
                raise ValueError("give arrival_step or arrival_time, not both")
        ids = self.llm.encode(prompt)
        self.llm.check_request(ids, sampling)
        return self._queue(ids, sampling, arrival_step, arrival_time)

    def _queue(self, ids, sampling, arrival_step, arrival_time) -> int:
        step = max(arrival_step or 0, self.step_index)
        self._submitted.append((ids, sampling, step, arrival_time))
        if arrival_time is not None and arrival_time > self.scheduler.clock.now():
            uid = self.scheduler.new_uid()
            self._arrivals.add(Due(arrival_time, uid, ids, sampling), by_time=True)
        elif arrival_step is None or arrival_step <= self.step_index:
            uid = self.scheduler.add_request(ids, sampling)
        else:
            uid = self.scheduler.new_uid()
            self._arrivals.add(Due(arrival_step, uid, ids, sampling), by_time=False)
        return uid

    def add_trace(
        self, trace: Trace, sampling: SamplingParams | None = None, seed: int = 0
    ) -> list[int]:
        """Queue every request of `trace` (`workbench.traces.load`), each arriving at its second
        on the run's clock (which starts at 0 on a new or reset workbench). Prompts as
        `trace.to_requests` makes them (this model's vocabulary, `seed`); `sampling` (greedy by
        default) runs each request to its recorded output length. Every request is checked
        before any is queued; returns their uids, in trace order."""
        if not isinstance(trace, Trace):
            raise TypeError(f"add_trace takes a Trace (workbench.traces.load), got {trace!r}")
        self.llm.check_open()
        requests = trace.to_requests(self.llm.engine.model_config.vocab_size, seed, sampling)
        checked = checked_requests(self.llm, requests, arrival="time")
        with self._engine_held():
            uids = [self._queue(ids, sp, None, seconds) for ids, sp, _, seconds in checked]
        self._notify(final=False)
        return uids

    def abort(self, uid: int) -> dict:
        """Stop a request wherever it is; returns its output so far (finish_reason "abort")."""
        uid = V.integer("uid", uid, 0)
        self.llm.check_open()
        with self._engine_held():
            due = self._arrivals.take(uid)
            if due is not None:
                self.scheduler.add_request(due.ids, due.sampling, uid=uid)
            req = self.scheduler.abort(uid)
            if self.llm.server is not None:  # the client sees the end at once
                self.llm.server.loop.flush()
        self._notify(final=True)
        return self.llm.output(req)

    def step(self, n: int = 1) -> StepRecord | None:
        """Run `n` scheduler steps; the last one's record (None when there was nothing to do).
        A hook that raised during a step raises HookError here."""
        if type(n) is not int or n < 1:
            n = V.integer("n", n, 1)
        record = None
        try:
            for i in range(n):
                record = self._step_once()
                if record is None:
                    break
                if i < n - 1:
                    self._notify(final=False)
        finally:
            self._end_call()
        return record

    def _step_once(self) -> StepRecord | None:
        scheduler = self.scheduler
        if scheduler is None:
            self.llm.check_open()
        server = self.llm.server
        if server is None:
            scheduler.clock.resume()
            record = self._engine_step()
        elif server.loop.paused:
            record = server.loop.step_once(raising=True)
        else:
            raise RuntimeError(
                f"the engine is serving HTTP clients ({server.url}) and steps by itself: "
                "wb.pause() first, then step; wb.resume() lets it run on"
            )
        if record is None:
            return None
        hooks = scheduler.probe.hooks
        if hooks.errors:
            hooks.raise_pending()
        return record.complete()

    def _engine_step(self) -> StepRecord | None:
        scheduler = self.scheduler
        if self._arrivals.waiting:
            self._arrivals.release(scheduler)
        return scheduler.step() or scheduler.flush()

    def _served_step(self) -> StepRecord | None:
        record = self._engine_step()
        if record is not None:
            self.hooks.raise_pending()
            if self._views is not None:
                self._views.poke()
        return record

    @contextlib.contextmanager
    def _engine_held(self):
        # NOTE: while serving, the scheduler belongs to the server's thread between steps
        server = self.llm.server
        if server is None:
            yield
            return
        with server.loop.lock:
            yield
        server.loop.wake()

    def _end_call(self) -> None:
        scheduler = self.scheduler
        if scheduler is not None:
            probe = scheduler.probe
            if probe.profiling:
                probe.flush()
            if probe.history.sessions:
                probe.history.fill_in()
            if self.llm.server is None:  # a server's clients arrive on the run's clock
                scheduler.clock.pause()
        if self._observers:
            self._notify(final=True)

    def observe(self, fn: Callable[[bool], None]) -> Callable[[], None]:
        """Call `fn(final)` after each step (`final` True when a call ends); returns a function
        that stops it."""
        if not callable(fn):
            raise TypeError(f"observe takes a function of one argument (final), got {fn!r}")
        self._observers.append(fn)

        def stop() -> None:
            if fn in self._observers:
                self._observers.remove(fn)

        return stop

    def _notify(self, final: bool) -> None:
        with self._notifying:  # one view redraws at a time, whichever thread asks
            for observer in list(self._observers):
                observer(final)

    def run(self, max_steps: int | None = None, progress: bool = True) -> StepRecords:
        """Step until every request is done (or `max_steps`); the records of those steps."""
        from tqdm.auto import tqdm

        max_steps = V.optional_integer("max_steps", max_steps, 0)
        progress = V.boolean("progress", progress)
        records = StepRecords()
        bar = tqdm(total=max_steps, desc="steps", unit="step", disable=not progress, leave=False)
        try:
            while max_steps is None or len(records) < max_steps:
                record = self._step_once()
                if record is None:
                    break
                records.append(record)
                bar.update()
                bar.set_postfix(queue=record.queue_len, running=record.running)
                self._notify(final=False)
        finally:
            bar.close()
            self._end_call()
        return records

    def run_until(
        self, predicate: Callable[[StepRecord], bool], max_steps: int | None = None
    ) -> StepRecord | None:
        """Step until a record satisfies `predicate`; that record, or None if the run ended."""
        V.function_of_one("predicate", predicate, "a StepRecord")
        max_steps = V.optional_integer("max_steps", max_steps, 0)
        taken = 0
        try:
            while max_steps is None or taken < max_steps:
                record = self._step_once()
                if record is None:
                    return None
                taken += 1
                self._notify(final=False)
                if predicate(record):
                    return record
            return None
        finally:
            self._end_call()

    def reset(self, again: bool = False) -> list[int]:
        """Drop every request, the history and the prefix cache; hooks stay. `again=True` adds
        the same requests once more and returns their new uids."""
        again = V.boolean("again", again)
        self.llm.check_open().check_not_serving("reset")
        requests = self._submitted or self._previous
        self._previous, self._submitted = requests, []
        self.scheduler.abort_all()
        self._arrivals.clear()
        self.scheduler.check_integrity()
        uids = []
        if again:
            uids = [self._add_again(request) for request in requests]
        self._notify(final=True)
        return uids

    def _add_again(self, request: tuple) -> int:
        ids, sampling, step, seconds = request
        if seconds is not None:
            return self.add_request(ids, sampling, arrival_time=seconds)
        return self.add_request(ids, sampling, arrival_step=step)

    @property
    def submitted_count(self) -> int:
        """How many requests `reset(again=True)` would add again."""
        return len(self._submitted or self._previous)

    def reconfigure(self, record: str | None = None, **settings: Any) -> None:
        """Change the schedule (`LLM.reconfigure`) on the same engine; only when idle. A new run
        starts, as after `reset` (`snapshot()` the one before to keep it)."""
        if self._arrivals:
            raise RuntimeError(
                f"reconfigure needs an idle workbench: {len(self._arrivals)} requests are due to "
                "arrive (run them, abort them, or reset)"
            )
        self.llm.reconfigure(record=record, **settings)
        self.scheduler, self.config = self.llm.scheduler, self.llm.config
        if self._submitted:  # the run's requests are the previous run's now, as after reset
            self._previous, self._submitted = self._submitted, []
        self._clock_at_zero()
        self._notify(final=True)

    def compare(
        self,
        settings: Mapping[str, Mapping[str, Any]],
        requests: Sequence[tuple] | Trace | None = None,
        progress: bool = True,
        arrival: str = "step",
        repeats: int = 1,
    ) -> dict[str, RunHistory]:
        """Run the same requests under each named setting; the runs by name, for `viz.compare_*`.

        `settings`: name -> `reconfigure` arguments, each applied to the settings the workbench
        has when `compare` is called (not to the setting that ran before it); `requests`:
        ``(prompt, sampling[, arrival])`` tuples, or a `Trace` (its requests arrive at their
        times), by default those added since the last reset. `repeats` runs the settings in
        rounds, so that a slow spell falls on all alike. Afterwards the workbench has its
        settings back, in a new run (the runs are in what `compare` returns)."""
        repeats = V.integer("repeats", repeats, 1)
        progress = V.boolean("progress", progress)
        V.choice("arrival", arrival, ("step", "time"))
        self.llm.check_open().check_not_serving("compare")
        if requests is None:
            workload = list(self._submitted or self._previous)
            if not workload:
                raise ValueError("requests is None and no request was added since the last reset")
        else:
            workload = checked_requests(self.llm, requests, arrival)
        checked = checked_settings(self.llm, settings)
        base = self.llm.settings()
        for name, options in checked.items():
            if options.get("record", base["record"]) == "off":
                raise ValueError(
                    f"compare needs each run's step records: setting {name!r} would run with "
                    "record='off'; give the workbench (or the setting) record='light' or 'full'"
                )
        done: dict[str, list[RunHistory]] = {name: [] for name in checked}
        try:
            for round_ in range(repeats):
                for name, options in checked.items():
                    self.reset()
                    self.reconfigure(**{**base, **options})
                    for request in workload:
                        self._add_again(request)
                    self.run(progress=progress)
                    meta = {"repeat": round_} if repeats > 1 else {}
                    done[name].append(self.snapshot(run=name, settings=options, **meta))
        except BaseException:  # (a hook that raised, Ctrl-C): not left in a setting either
            with contextlib.suppress(Exception):
                self.reset()
                self.reconfigure(**base)
            raise
        self.reconfigure(**base)
        for runs in done.values():
            for run in runs:
                run.repeats = tuple(runs)
        return {name: runs[0] for name, runs in done.items()}

    def serve(
        self,
        port: int = 8000,
        host: str = "127.0.0.1",
        served_model_name: str | None = None,
        max_queued_requests: int = MAX_QUEUED_REQUESTS,
        stream_interval: int = 1,
    ) -> Server:
        """Serve OpenAI-compatible HTTP clients on `host`:`port` (0: any free port) from a
        thread, recording as usual; returns at once. `pause()`, `step()` and `resume()` drive
        it by hand; `stop_serving()` ends it. Needs the `serve` extra."""
        self.llm._check_can_serve()
        self.scheduler.clock.resume()
        self._views = ViewThread(self._notify)
        host_ = Host(self.llm, self._served_step, lambda: self.is_done, keep_finished=True)
        try:
            self.llm.server = Server(
                host_, port, host, served_model_name, max_queued_requests, stream_interval
            )
            self.llm.server.start()
        except BaseException:
            self.llm.server = None
            self._views.stop()
            self._views = None
            self.scheduler.clock.pause()
            raise
        self._notify(final=True)
        return self.llm.server

    def pause(self) -> None:
        """While serving: stop after the step in progress; clients wait."""
        self._server_or_raise("pause").pause()
        self._notify(final=True)

    def resume(self) -> None:
        """While serving: let the engine run on after `pause()`."""
        self._server_or_raise("resume").resume()

    def stop_serving(self) -> None:
        """End serving; requests in flight end with finish_reason "abort"."""
        self.llm.stop_serving()
        if self._views is not None:
            self._views.stop()
            self._views = None
        if self.scheduler is not None:
            self.scheduler.clock.pause()
        self._notify(final=True)

    @property
    def server(self) -> Server | None:
        """The HTTP server while it serves (`serve()`), else None."""
        return self.llm.server

    def _server_or_raise(self, what: str) -> Server:
        if self.llm.server is None:
            raise RuntimeError(f"{what}() is for a serving workbench: serve() first")
        return self.llm.server

    def close(self) -> None:
        """Free the engine's memory; the workbench cannot step after."""
        if self.llm.is_open:
            self.stop_serving()
        self._arrivals.clear()
        self.llm.close()
        self.scheduler = self.engine = None

    def __enter__(self) -> Workbench:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_integrity(self) -> None:
        """Check the KV pool's accounting (`Scheduler.check_integrity`)."""
        self.llm.check_open()
        with self._engine_held():
            self.scheduler.check_integrity()

    def outputs(self) -> list[dict]:
        """The finished requests, as `LLM.generate` returns them, by uid."""
        return [self.llm.output(req) for _, req in sorted(self.scheduler.finished.items())]

    def save(self, path: str | Path) -> Path:
        """The run's tables, settings and each request's prompt and answer, in one file."""
        return self.history.save(path, self.run_meta())

    def run_meta(self) -> dict:
        """The settings and each request's prompt and answer, as a saved run carries them."""
        return {**self.llm.run_meta(), "texts": self.texts()}

    def texts(self) -> dict[str, list[str]]:
        """Each request's prompt and answer so far, by uid (a string: JSON keys)."""
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
        """Write the run as Chrome trace JSON."""
        from .history.trace import export_trace

        history = self.history
        return export_trace(history.steps, history.events, path, self.llm.run_meta())

    def snapshot(self, **meta: Any) -> RunHistory:
        """The run so far as a `RunHistory` that later steps leave unchanged."""
        return RunHistory(dict(self.history.tables()), {**self.run_meta(), **meta})

    def dashboard(self):
        """An ipywidgets dashboard that follows the workbench as it steps."""
        from .viz.dashboard import Dashboard

        return Dashboard(self)

    def report(self, path: str | Path, title: str | None = None) -> Path:
        """Write the run as one self-contained HTML report."""
        from .viz.report import write_report

        return write_report(self.history, path, title=title, meta=self.run_meta())

    def __repr__(self) -> str:
        s = self.scheduler
        if s is None:
            return f"Workbench({self.config.model}, closed)"
        return (
            f"Workbench({self.config.model} on {self.engine.device}, step {s.step_index}, "
            f"{len(s.prefill.queue)} waiting, {len(s.decode.running)} running, "
            f"{len(s.finished)} finished, policy={self.config.policy!r}, "
            f"record={self.llm.record!r})"
        )
