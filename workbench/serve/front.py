"""The HTTP process: uvicorn, the routes, checks, detokenising, streaming and metrics. It runs as
``python -m workbench.serve.front`` so that this Python work takes nothing from the engine's
steps (a thread would share its interpreter lock) and no script of the caller's is imported.

Messages, engine -> here: ("step", tokens by request, ends, cached tokens at admission, the
engine's state, refusals by reason, step seconds, when it was sent, log probabilities by the
requests that asked), ("stop",). Here -> engine:
("ready", port), ("failed", message), ("adds", [(rid, token ids, sampling, received), ...]),
("abort", rid). Framed as `frames` says; on the event loop the connection is an asyncio transport
(`EngineLink`): the engine may be seconds into a step while clients send requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
import time

from .frames import Frames, encode
from .service import Limits, Service

log = logging.getLogger("workbench.serve")


def main(argv: list[str] | None = None) -> None:
    """``python -m workbench.serve.front``, its spec (where to connect back, the key, the
    engine's `Limits`) one JSON line on stdin (a command line's arguments are anyone's to read
    in `ps`), or as its argument."""
    from multiprocessing.connection import Client

    args = argv if argv is not None else sys.argv[1:]
    spec = json.loads(args[0] if args else sys.stdin.readline())
    conn = Client(_address(spec["address"]), authkey=bytes.fromhex(spec["authkey"]))
    serve(conn, Limits(**spec["limits"]))


def _address(address):
    return tuple(address) if isinstance(address, list) else address


def serve(conn, limits: Limits) -> None:
    """Listen, and serve until the engine says stop (or is gone); `conn` goes both ways."""
    try:
        sock = _bind(limits.host, limits.port)
    except OSError as exc:
        conn.send(("failed", f"the server could not listen on {limits.host}:{limits.port}: {exc}"))
        return
    import uvicorn
    from transformers import AutoTokenizer

    from .app import create_app

    tokenizer = AutoTokenizer.from_pretrained(limits.model_dir)
    server: uvicorn.Server | None = None
    link = EngineLink(lambda message: _deliver(message, service, lambda: server))
    service = Service(limits, tokenizer, link.send)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        # NOTE: the event loop reads the engine's messages itself: a reader thread would wait for
        # the interpreter lock while the loop writes many streams, delaying every token
        engine = socket.socket(fileno=os.dup(conn.fileno()))
        await asyncio.get_running_loop().connect_accepted_socket(lambda: link, engine)
        link.send(("ready", sock.getsockname()[1]))
        yield

    app = create_app(service, lifespan)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class EngineLink(asyncio.Protocol):
    """The engine's connection on the event loop (`frames`): a message out is kept by the
    transport while the engine is inside a step, never written in part nor waited for (uvloop
    makes the socket non-blocking, where `Connection.send` raised and tore a message that did
    not fit); a message in is handed on once whole."""

    def __init__(self, on_message) -> None:
        self._on_message = on_message
        self._frames = Frames()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self._transport = transport

    def send(self, message: tuple) -> None:
        if self._transport is None or self._transport.is_closing():
            return  # the engine is gone or stopping: `service.serving` already refuses requests
        self._transport.write(encode(message))

    def data_received(self, data: bytes) -> None:
        for message in self._frames.feed(data):
            self._on_message(message)

    def connection_lost(self, exc) -> None:
        self._on_message(("stop",))


def _deliver(message: tuple, service: Service, server) -> None:
    """On the event loop: one of the engine's messages; at "stop" (or the engine gone), shut
    down."""
    if message[0] != "stop":
        service.deliver(message)
    elif service.serving:
        service.serving = False
        asyncio.get_running_loop().create_task(_shut_down(service, server))


async def _shut_down(service: Service, server) -> None:
    """Let the answers under way end (the engine ended their requests), then stop uvicorn."""
    deadline = time.monotonic() + 10
    while service.responses and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    uvicorn_server = server()
    if uvicorn_server is not None:
        uvicorn_server.should_exit = True


if __name__ == "__main__":
    main()
