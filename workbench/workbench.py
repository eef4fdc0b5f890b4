"""Workbench: the engine and scheduler driven step by step, with a record of every step.

    wb = Workbench("smollm2")
    uid = wb.add_request("The capital of France is", SamplingParams(max_tokens=8))
    record = wb.step()          # one scheduler step; a StepRecord (renders as a table)
    wb.run()                    # to the end, with a progress bar
    wb.history.ledger           # pandas tables: steps, ledger, requests, admissions, events
    wb.save("run.json")         # load_run("run.json") shows it again, no model needed

Overlap scheduling is off by default here so that records read naturally (a step's batch is
launched after the previous one completed); turn it on to see what a serving engine does.

The run's clock (arrival, launch and completion times, TTFT in ms) runs while the workbench
steps (`step`, `run`, `run_until`, `compare`) and stops between calls: the time a person takes
between two cells is theirs, not the run's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import validate as V
from .arrivals import Arrivals, Due
from .compare_inputs import checked_requests, checked_settings
from .core import SamplingParams
from .instrument.hooks import HookRegistry
from .llm import LLM, Prompt
from .results import Results
from .runs import RunHistory
from .scheduler.record import StepRecord, StepRecords
from .serve import MAX_QUEUED_REQUESTS, Host, Server
from .serve.views import ViewThread


class Workbench(Results):
    def __init__(
        self,
        model: str = "smollm2",
        *,
        record: str = "light",
        overlap: bool = False,
        **options: Any,
    ) -> None:
        self.llm = LLM(model, record=record, overlap=overlap, **options)
        self.scheduler = self.llm.scheduler
        self.engine = self.llm.engine
        self.tokenizer = self.llm.tokenizer
        self.config = self.llm.config
        self._arrivals = Arrivals()  # requests added ahead of their arrival
        # requests added since the last reset (prompt ids, sampling, arrival step, arrival time),
        # and those of the run before it: what reset(again=True) adds again
        self._submitted: list[tuple[list[int], SamplingParams, int, float | None]] = []
        self._previous: list[tuple[list[int], SamplingParams, int, float | None]] = []
        self._observers: list[Callable[[bool], None]] = []  # views; called with final=True/False
        self._views: ViewThread | None = None  # while serving: the views, off the engine's thread
        self._notifying = threading.RLock()  # (serving: the views thread and callers alike)
        # NOTE: the run's clock runs only while the workbench steps: between calls it is the
        # person's time, not the run's (a request added meanwhile arrives when stepping goes on)
        self.scheduler.clock.pause()

    # -- what to look at --------------------------------------------------------------------
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

    # -- requests ---------------------------------------------------------------------------
    def add_request(
        self,
        prompt: Prompt,
        sampling: SamplingParams | None = None,
        arrival_step: int | None = None,
        arrival_time: float | None = None,
    ) -> int:
        """Queue a request (checked now). With `arrival_step` it joins the queue at that step;
        with `arrival_time`, when the run's clock (seconds since it started or was reset)
        reaches it, an idle engine waiting for it meanwhile. While serving, it joins the
        clients' requests."""
        self.llm.check_open()
        with self._engine_held():
            uid = self._add_request(prompt, sampling, arrival_step, arrival_time)
        self._notify(final=False)  # views: there is work now (they redraw when they can)
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

    def abort(self, uid: int) -> dict:
        """Stop a request: waiting, due to arrive later, part-way through its prompt or decoding.

        Returns its output so far (finish_reason "abort"); it stays in `outputs()` and its row
        in `history.requests` says when it was aborted. What it held is freed (with overlap, once
        the batch in flight that still computes for it is collected).
        """
        uid = V.integer("uid", uid, 0)
        with self._engine_held():
            due = self._arrivals.take(uid)
            if due is not None:  # it arrives now, and is aborted at once
                self.scheduler.add_request(due.ids, due.sampling, uid=uid)
            req = self.scheduler.abort(uid)
            if self.llm.server is not None:  # a client's request ends at once, on its side too
                self.llm.server.loop.flush()
        self._notify(final=True)
        return self.llm.output(req)

    # -- stepping ---------------------------------------------------------------------------
    def step(self, n: int = 1) -> StepRecord | None:
        """Run `n` scheduler steps; the last one's record (None when there was nothing to do).

        A hook that raised during a step raises HookError here, after that step completed.
        """
        if type(n) is not int or n < 1:
            n = V.integer("n", n, 1)
        record = None
        try:
            for i in range(n):
                record = self._step_once()
                if record is None:
                    break
                if i < n - 1:
                    self._notify(final=False)  # views follow a long step(n) as it goes
        finally:
            self._end_call()
        return record

    def _step_once(self) -> StepRecord | None:
        scheduler = self.scheduler
        if scheduler is None:
            self.llm.check_open()  # (raises: closed)
        server = self.llm.server
        if server is None:
            scheduler.clock.resume()
            record = self._engine_step()
        elif server.loop.paused:  # by hand: the clients' requests join it, its tokens reach them
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
        """One scheduler step, the requests due now queued first; its record (None: nothing
        to do)."""
        scheduler = self.scheduler
        if self._arrivals.waiting:
            self._arrivals.release(scheduler)
        return scheduler.step() or scheduler.flush()

    def _served_step(self) -> StepRecord | None:
        """A step the server's thread takes: the views follow from a thread of their own."""
        record = self._engine_step()
        if record is not None:
            self.hooks.raise_pending()  # (the server's thread logs a hook's error)
            if self._views is not None:
                self._views.poke()
        return record

    @contextlib.contextmanager
    def _engine_held(self):
        """While serving: hold the engine between two of the server's steps (its scheduler is
        not shared), and let the server's thread see the change at once."""
        server = self.llm.server
        if server is None:
            yield
            return
        with server.loop.lock:
            yield
        server.loop.wake()

    def _end_call(self) -> None:
        """After every step, run or run_until: the profiler's events (record="full") go to the
        records (the records handed back show them), then the views redraw."""
        scheduler = self.scheduler
        if scheduler is not None:  # not closed
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
        """Call `fn(final)` whenever the workbench has stepped: `final` False during a `run`
        (after each step), True when a call ends (step, run, reset, reconfigure). Returns the
        function that stops it (the dashboard follows the engine this way)."""
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
        """Step until every request is done (or `max_steps`); the records of those steps (a
        list that a notebook shows as one line)."""
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
        """Step until a record satisfies `predicate` (a conditional breakpoint); that record,
        or None if the run ended (or `max_steps` passed) first."""
        if not callable(predicate):
            raise TypeError(f"predicate must be a function of a StepRecord, got {predicate!r}")
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
        """Drop every request and the history; empty the prefix cache. Hooks stay.

        With `again=True` the requests added since the last reset are added once more (same
        prompts, sampling and arrival steps), so the same run starts over: after a
        `reconfigure`, the same requests under another schedule. Returns their new uids."""
        again = V.boolean("again", again)
        self.llm.check_not_serving("reset")
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
        """How many requests `reset(again=True)` would add again: those added since the last
        reset, or, when none were, those of the run before it."""
        return len(self._submitted or self._previous)

    def reconfigure(self, record: str | None = None, **settings: Any) -> None:
        """Another schedule on the same engine (weights, KV pool and CUDA graphs kept):
        `max_extend_tokens`, `policy`, `cache`, `overlap`, `share_threshold`, `record`,
        `profile_steps`, `max_profiled_steps`. Only
        when every request is done; the history starts again, hooks stay."""
        if self._arrivals:
            raise RuntimeError(
                f"reconfigure needs an idle workbench: {len(self._arrivals)} requests are due to "
                "arrive (run them, abort them, or reset)"
            )
        self.llm.reconfigure(record=record, **settings)
        self.scheduler, self.config = self.llm.scheduler, self.llm.config
        self.scheduler.clock.pause()
        self._notify(final=True)

    def compare(
        self,
        settings: Mapping[str, Mapping[str, Any]],
        requests: Sequence[tuple] | None = None,
        progress: bool = True,
        arrival: str = "step",
        repeats: int = 1,
    ) -> dict[str, RunHistory]:
        """The same requests run under each named setting on this engine (weights, KV pool
        and CUDA graphs loaded once, warmed up when it was built); the runs, by name, for
        `viz.compare_table` / `compare_summary` / `compare_chart`.

        `settings`: name -> `reconfigure` arguments, e.g.
        ``{"chunk 256": dict(max_extend_tokens=256), "mixed": dict(policy="mixed")}``;
        `requests`: ``(prompt, sampling)`` or ``(prompt, sampling, arrival)`` tuples, the
        arrival a step (`arrival="step"`) or seconds on the run's clock (`arrival="time"`: the
        engine serves them as they arrive, waiting when idle); by default the requests added
        since the last reset, with their arrivals. `repeats`: how many times each setting
        runs, in rounds (every setting once, then again), so that a slow spell of the machine
        falls on every setting alike; each setting's run is then the first of its `repeats`
        (a tuple of all of them, in the order they ran), and the tables give each figure's
        mean and spread over them.

        Every run starts from the same state: an empty prefix cache, nothing queued or
        running, on an engine whose paths were all taken once before its first measured
        step. Every setting and request is checked before the first run starts; afterwards
        the workbench holds the last run."""
        repeats = V.integer("repeats", repeats, 1)
        self.llm.check_not_serving("compare")
        if requests is None:
            workload = list(self._submitted or self._previous)
            if not workload:
                raise ValueError("requests is None and no request was added since the last reset")
        else:
            workload = checked_requests(self.llm, requests, arrival)
        checked = checked_settings(self.llm, settings)
        done: dict[str, list[RunHistory]] = {name: [] for name in checked}
        for round_ in range(repeats):
            for name, options in checked.items():
                self.reset()
                self.reconfigure(**options)
                for request in workload:
                    self._add_again(request)
                self.run(progress=progress)
                meta = {"repeat": round_} if repeats > 1 else {}
                done[name].append(self.snapshot(run=name, settings=options, **meta))
        for runs in done.values():
            for run in runs:
                run.repeats = tuple(runs)
        return {name: runs[0] for name, runs in done.items()}

    # -- serving ---------------------------------------------------------------------------
    def serve(
        self,
        port: int = 8000,
        host: str = "127.0.0.1",
        served_model_name: str | None = None,
        max_queued_requests: int = MAX_QUEUED_REQUESTS,
        stream_interval: int = 1,
    ) -> Server:
        """Serve OpenAI-compatible HTTP clients on `host`:`port` (0: any free port) and return
        at once (`workbench.serve`): a thread steps this workbench as requests come, with records
        and hooks as usual, so `wb.history` grows and `wb.dashboard()` follows. `pause()` stops
        the engine after the step in progress (clients wait), `step()` then steps it by hand,
        `resume()` lets it run on; `stop_serving()` or `close()` ends it (requests in flight end
        with finish_reason "abort"). While it serves, the run's clock runs on. Needs the `serve`
        extra (FastAPI, uvicorn)."""
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
        """While serving: stop the engine after the step in progress (clients wait, their
        connections stay open); `step()` then advances it by hand, `resume()` lets it run."""
        self._server_or_raise("pause").pause()
        self._notify(final=True)

    def resume(self) -> None:
        """While serving: let the engine run on after `pause()`."""
        self._server_or_raise("resume").resume()

    def stop_serving(self) -> None:
        """End serving: requests in flight end with finish_reason "abort" (freed), the port
        is free again; the workbench and its history stay."""
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
        """Give back what the engine holds (GPU memory: weights, KV pool, CUDA graphs); the
        workbench cannot step after. ``with Workbench(...) as wb:`` closes it at the end (a
        server it runs stops first)."""
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
        """The KV pool's accounting (`Scheduler.check_integrity`); while serving, between two
        of the server's steps."""
        with self._engine_held():
            self.scheduler.check_integrity()

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
