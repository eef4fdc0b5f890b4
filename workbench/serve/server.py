"""A server's life, from the engine's process: the HTTP process (`front.py`) started beside it,
and a thread that steps the engine (`loop.py`).

    server = wb.serve(port=8000)     # returns once the port is open; the notebook goes on
    server.url                       # "http://127.0.0.1:8000/v1"
    wb.pause(); wb.step(); wb.resume()
    wb.stop_serving()                # requests in flight end ("abort"), the port is free again
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from .. import validate as V
from .frames import Channel
from .loop import EngineLoop, Host
from .service import MAX_QUEUED_REQUESTS, Limits

START_TIMEOUT_S = 300  # the HTTP process imports transformers and loads the tokenizer


class Server:
    """An OpenAI-compatible HTTP server on a running engine (see the module)."""

    def __init__(
        self,
        host: Host,
        port: int = 8000,
        hostname: str = "127.0.0.1",
        served_model_name: str | None = None,
        max_queued_requests: int = MAX_QUEUED_REQUESTS,
        stream_interval: int = 1,
    ) -> None:
        llm = host.llm
        model = str(llm.config.model)
        name = model if served_model_name is None else served_model_name
        self.limits = Limits(
            model=model,
            model_dir=str(llm.engine.model_dir),
            served_name=V.text("served_model_name", name),
            vocab_size=llm.engine.model_config.vocab_size,
            max_seq_len=llm.engine.max_seq_len,
            page_size=llm.config.page_size,
            kv_capacity=llm.scheduler.cache.total_size,
            max_queued=V.integer("max_queued_requests", max_queued_requests, 1),
            host=V.text("host", hostname),
            port=V.integer("port", port, 0, 65535),
            stream_interval=V.integer("stream_interval", stream_interval, 1),
            tp_size=llm.engine.tp.size,
        )
        self.name, self.hostname, self.port = self.limits.served_name, hostname, port
        self.host = host
        self.loop = EngineLoop(host)
        self.serving = False
        self._process: subprocess.Popen | None = None
        self._conn = None  # to the HTTP process: the handshake's, then its socket as a Channel
        self._channel: Channel | None = None

    @property
    def url(self) -> str:
        """The API's base URL, for `openai.OpenAI(base_url=server.url, api_key="none")`."""
        return f"http://{self.hostname}:{self.port}/v1"

    def start(self) -> Server:
        """Start the HTTP process (returns once its port is open), then step as requests come."""
        from multiprocessing.connection import Listener

        key = os.urandom(16)
        family = "AF_UNIX" if hasattr(socket, "AF_UNIX") else "AF_INET"
        listener = Listener(family=family, authkey=key)
        spec = {"address": listener.address, "authkey": key.hex(), "limits": asdict(self.limits)}
        root = str(Path(__file__).resolve().parents[2])  # this checkout's (or install's) workbench
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        # the spec on its stdin, not its command line: the key is not for `ps` to show
        self._process = subprocess.Popen(
            [sys.executable, "-m", "workbench.serve.front"],
            stdin=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        # (a process that died at once reads nothing: `_accept` says why it ended)
        with contextlib.suppress(BrokenPipeError), self._process.stdin as stdin:
            stdin.write(json.dumps(spec).encode() + b"\n")
        try:
            self._conn = _accept(listener, self._process)
        finally:
            listener.close()
        kind, detail = self._conn.recv() if self._conn.poll(START_TIMEOUT_S) else ("none", None)
        if kind != "ready":
            self._process.wait(timeout=30)
            if kind == "failed":
                if "in use" in str(detail):
                    advice = "give another port, or port 0 (--port 0) for any free one"
                else:
                    advice = "give a host this machine has (127.0.0.1, 0.0.0.0, or its address)"
                raise OSError(f"{detail}; {advice}")
            raise RuntimeError(f"the HTTP process did not start in {START_TIMEOUT_S} s")
        self.port, self.serving = detail, True
        self._channel = Channel(self._conn)
        self.loop.start(self._channel)
        return self

    def pause(self) -> None:
        """Stop the engine after the step in progress; clients wait, connections stay open."""
        self.loop.pause()

    def resume(self) -> None:
        self.loop.resume()

    def stop(self, timeout_s: float = 30.0) -> None:
        """End it: requests in flight end with finish_reason "abort"; the engine stays. The
        HTTP process has `timeout_s` to read what is left and end, or is killed."""
        if not self.serving:
            return
        self.serving = False
        with self.loop.lock:
            self.loop.abort_all()
            # overlap: a batch in flight still holds what the aborted requests had
            self.host.llm.scheduler.flush()
            self.loop.flush()
        self.loop.stop()
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(OSError):  # the HTTP process may be gone already
            self._channel.send(("stop",))
            self._channel.finish(timeout_s)
        try:
            self._process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        self._channel.close()
        self._conn.close()

    def __repr__(self) -> str:
        state = "serving" if self.serving else "stopped"
        paused = ", paused" if self.serving and self.loop.paused else ""
        return f"Server({self.name!r} at {self.url}, {state}{paused})"


def _accept(listener, process: subprocess.Popen):
    """The HTTP process's connection, or an error if it ends (or takes too long) first."""
    accepted: list = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while thread.is_alive() and process.poll() is None and time.monotonic() < deadline:
        thread.join(timeout=0.1)
    if not accepted:
        process.kill()
        raise RuntimeError(f"the HTTP process exited (code {process.poll()}) before it connected")
    return accepted[0]
