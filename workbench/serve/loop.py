"""The engine's side of a server: a thread that steps the engine while requests come from the
HTTP process (`front.py`), and one message a step back to it.

Whoever steps the scheduler holds `EngineLoop.lock` and first reads the HTTP process's requests;
while paused the thread still reads them, so a client that leaves frees its KV at once.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("workbench.serve")


@dataclass
class Host:
    llm: Any  # workbench.LLM
    step: Callable[[], Any]  # one step; None when there was nothing to do
    idle: Callable[[], bool]  # nothing waiting, running or due to arrive
    keep_finished: bool = False  # leave finished requests for `outputs()` (a Workbench)


@dataclass
class LoopTimes:
    """Where the engine's thread spent its time while serving, in seconds. Neither reading nor
    sending waits on the HTTP process (`frames.Channel`: a message in part waits for the next
    turn, one the socket cannot take yet waits in the outbox), so `read_s` and `send_s` are the
    engine's own work; `backlog_max` says how far the HTTP process fell behind reading."""

    turns: int = 0  # the thread's turns: the HTTP process's messages read, a step, one sent
    steps: int = 0  # of them, those whose step ran a batch (the others found nothing to do)
    stepping_s: float = 0.0  # in the engine's steps
    read_s: float = 0.0  # reading the HTTP process's requests and aborts, adding them
    send_s: float = 0.0  # sending it each step's tokens, ends and the engine's state
    exchange_max_s: float = 0.0  # the longest read and send of one step, together
    idle_s: float = 0.0  # waiting with nothing to step (nothing queued, running or due)
    backlog_max: int = 0  # the most bytes of the engine's messages the HTTP process had not read

    def __str__(self) -> str:
        def per_turn(seconds: float) -> float:
            return seconds / self.turns * 1e3 if self.turns else 0.0

        return (
            f"{self.steps} steps in {self.stepping_s:.2f} s; reading requests "
            f"{per_turn(self.read_s):.3f} ms a turn, sending tokens {per_turn(self.send_s):.3f} "
            f"ms a turn ({self.turns} turns, both at most {self.exchange_max_s * 1e3:.2f} ms in "
            f"one); idle with nothing to step {self.idle_s:.2f} s; at most "
            f"{self.backlog_max:,} bytes waited for the HTTP process to read"
        )


class EngineLoop:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.conn = None  # to the HTTP process (a `frames.Channel`), set by `start`
        self.lock = threading.RLock()  # held while the scheduler is touched
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.live: dict[int, int] = {}  # uid -> rid of a request from HTTP
        self._uid_of: dict[int, int] = {}
        self.paused = False
        self._stopping = False
        self.failures = 0
        self.queue_len = 0
        self._sent_queue_len = -1
        # what the step gave the HTTP process's requests, sent after it
        self._tokens: dict[int, list[int]] = {}
        self._logprobs: dict[int, list] = {}  # of the requests that asked, beside their tokens
        self._prompt_logprobs: dict[int, list] = {}  # with the first token of those that asked
        self._ends: list[tuple] = []  # (rid, reason, usage, error)
        self._cached: list[tuple[int, int]] = []
        self._refused: dict[str, int] = {}
        self._step_s: list[float] = []
        self.times = LoopTimes()
        self._handles: list = []
        self._thread = threading.Thread(target=self._run, name="workbench-engine", daemon=True)

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"!")

    def start(self, conn) -> None:
        self.conn = conn
        hooks = self.host.llm.hooks
        self._handles = [
            hooks.add("sample.end", self._on_tokens),
            hooks.add("request.finish", self._on_finish),
            hooks.add("reject", self._on_reject),
            hooks.add("admit", self._on_admit),
        ]
        self._thread.start()

    def stop(self) -> None:
        """End the thread after the step in progress; requests stay (`Server.stop` aborts first)."""
        self._stopping = True
        self.wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._wake_r.close()
        self._wake_w.close()

    def pause(self) -> None:
        """Stop stepping after the step in progress (returns once it has ended)."""
        self.paused = True
        with self.lock:  # waits for the step in progress
            pass

    def resume(self) -> None:
        self.paused = False
        self.wake()

    def _run(self) -> None:
        # NOTE: this thread reads the HTTP process's messages itself, between steps: a reader
        # thread would wait for the interpreter lock while steps run, delaying every request
        while not self._stopping:
            if self.paused or self.host.idle():
                waited = time.perf_counter()
                self._wait(0.05)
                if not self.paused:
                    self.times.idle_s += time.perf_counter() - waited
                if self._stopping:
                    return
            if self.paused:
                with self.lock:
                    self.drain()
                    self.flush()
            else:
                self.step_once()

    def _wait(self, timeout: float) -> None:
        """Until a message comes, `wake` is called or `timeout` passes; meanwhile what the
        socket could not take is written as it can."""
        conn = self.conn
        readers = [self._wake_r] if conn is None else [conn, self._wake_r]
        writers = [conn] if conn is not None and conn.pending else []
        readable, writable, _ = select.select(readers, writers, [], timeout)
        if writable:
            self._flush_pending()
        if self._wake_r in readable:
            with contextlib.suppress(OSError):
                while self._wake_r.recv(4096):
                    pass

    def _flush_pending(self) -> None:
        try:
            self.conn.flush()
        except OSError:
            log.warning("the HTTP process is gone: its requests' tokens are not sent")
            self.conn = None

    def step_once(self, raising: bool = False):
        """One step, the HTTP process's messages read first; None: nothing to do. A step that
        raises ends its requests with an error, and re-raises when `raising`."""
        started = time.perf_counter()
        with self.lock:
            stepped = started
            try:
                self.drain()
                stepped = time.perf_counter()
                result = self.host.step()
                if result is not None:
                    self._step_s.append(time.perf_counter() - started)
                    self.times.steps += 1
            except Exception:
                self.failures += 1
                if raising:
                    raise
                log.exception("a step failed while serving; its requests ended with an error")
                result = None
            finally:
                flushed = time.perf_counter()
                self.flush()
                self._count(started, stepped, flushed, time.perf_counter())
        return result

    def _count(self, started: float, stepped: float, flushed: float, ended: float) -> None:
        times = self.times
        read, send = stepped - started, ended - flushed
        times.turns += 1
        times.stepping_s += flushed - stepped
        times.read_s += read
        times.send_s += send
        times.exchange_max_s = max(times.exchange_max_s, read + send)

    def drain(self) -> None:
        """Add the requests the HTTP process sent, abort those it cancelled (the lock is held)."""
        scheduler, conn = self.host.llm.scheduler, self.conn
        if conn is None:
            return
        if conn.pending:  # the last message's rest, if the socket can take it now
            self._flush_pending()
        messages = conn.receive()
        if conn.closed:
            log.warning("the HTTP process is gone; the engine serves what it has")
            self.conn = None
        for message in messages:
            if message[0] == "adds":
                now = time.perf_counter()
                for rid, ids, sampling, received in message[1]:
                    arrived = max(scheduler.clock.now() - (now - received), 0.0)
                    uid = scheduler.add_request(ids, sampling, arrived=arrived, source="http")
                    self.live[uid], self._uid_of[rid] = rid, uid
            elif message[0] == "abort":
                uid = self._uid_of.get(message[1])
                if uid is not None and uid in self.live:
                    with contextlib.suppress(ValueError):  # it ended meanwhile
                        scheduler.abort(uid)
        self.queue_len = len(scheduler.prefill.queue)

    def abort_all(self) -> None:
        """Abort every request that came over HTTP (the lock is held)."""
        self.drain()
        for uid in list(self.live):
            with contextlib.suppress(ValueError):  # it ended meanwhile
                self.host.llm.scheduler.abort(uid)

    def _on_tokens(self, event) -> None:
        live, tokens = self.live, self._tokens
        for uid, token in zip(event.uids, event.tokens):
            rid = live.get(uid)
            if token is not None and rid is not None:
                tokens.setdefault(rid, []).append(token)
        if event.logprobs is not None:
            for uid, token, entry in zip(event.uids, event.tokens, event.logprobs):
                rid = live.get(uid)
                if token is not None and rid is not None and entry is not None:
                    self._logprobs.setdefault(rid, []).append(entry)
        if event.prompt_logprobs is not None:
            for uid, entries in zip(event.uids, event.prompt_logprobs):
                rid = live.get(uid)
                if rid is not None and entries is not None:
                    self._prompt_logprobs[rid] = entries

    def _on_finish(self, event) -> None:
        rid = self.live.pop(event.uid, None)
        if rid is None:
            return
        self._uid_of.pop(rid, None)
        usage = (event.prompt_tokens, event.completion_tokens, event.cached_tokens)
        scheduler = self.host.llm.scheduler
        finished = scheduler.finished.get(event.uid)
        error = finished.error if finished is not None else None
        if not self.host.keep_finished:
            scheduler.finished.pop(event.uid, None)
        self._ends.append((rid, event.reason, usage, error))

    def _on_admit(self, event) -> None:
        rid = self.live.get(event.uid)
        if rid is not None and event.kind != "decode":
            self._cached.append((rid, event.cached_len))

    def _on_reject(self, event) -> None:
        self._refused[event.reason] = self._refused.get(event.reason, 0) + 1

    def flush(self) -> None:
        """Send the step's tokens and ends and the engine's state in one message (lock held)."""
        changed = self.queue_len != self._sent_queue_len
        if not (self._tokens or self._ends or self._cached or self._step_s or changed):
            return
        occupancy = self.host.llm.scheduler.occupancy()
        self.queue_len = occupancy.queue_len
        state = {
            "running": occupancy.running,
            "waiting": occupancy.queue_len,
            "kv_total": occupancy.kv_total,
            "kv_free": occupancy.kv_free,
            "kv_evictable": occupancy.kv_evictable,
            "page_size": self.host.llm.scheduler.config.page_size,
        }
        message = (
            "step",
            list(self._tokens.items()),
            self._ends,
            self._cached,
            state,
            self._refused,
            self._step_s,
            time.perf_counter(),  # sent: the HTTP process times its delivery from here
            list(self._logprobs.items()),
            list(self._prompt_logprobs.items()),
        )
        self._tokens, self._ends, self._cached, self._refused, self._step_s = {}, [], [], {}, []
        self._logprobs, self._prompt_logprobs = {}, {}
        self._sent_queue_len = self.queue_len
        try:
            if self.conn is not None:
                self.conn.send(message)
                self.times.backlog_max = max(self.times.backlog_max, self.conn.pending)
        except OSError:
            log.warning("the HTTP process is gone: its requests' tokens are not sent")
            self.conn = None
