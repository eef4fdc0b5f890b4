"""The HTTP process: uvicorn, the routes, checks, detokenising, streaming and metrics. It runs as
``python -m workbench.serve.front`` so that this Python work takes nothing from the engine's
steps (a thread would share its interpreter lock) and no script of the caller's is imported.

Messages, engine -> here: ("step", tokens by request, ends, cached tokens at admission, the
engine's state, refusals by reason, step seconds, when it was sent), ("stop",). Here -> engine:
("ready", port), ("failed", message), ("adds", [(rid, token ids, sampling, received), ...]),
("abort", rid), ("stopped",).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
import threading
import time

from .service import Limits, Service

log = logging.getLogger("workbench.serve")


def main(argv: list[str] | None = None) -> None:
    """``python -m workbench.serve.front SPEC``: where to connect back, the engine's `Limits`."""
    from multiprocessing.connection import Client

    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    conn = Client(_address(spec["address"]), authkey=bytes.fromhex(spec["authkey"]))
    serve(conn, Limits(**spec["limits"]))


def _address(address):
    return tuple(address) if isinstance(address, list) else address


def serve(conn, limits: Limits) -> None:
    """Listen, and serve until the engine says stop (or is gone); `conn` goes both ways."""
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        with send_lock:
            conn.send(message)

    try:
        sock = _bind(limits.host, limits.port)
    except OSError as exc:
        send(("failed", f"the server could not listen on {limits.host}:{limits.port}: {exc}"))
        return
    import uvicorn
    from transformers import AutoTokenizer

    from .app import create_app

    tokenizer = AutoTokenizer.from_pretrained(limits.model_dir)
    service = Service(limits, tokenizer, send)
    server: uvicorn.Server | None = None

    @contextlib.asynccontextmanager
    async def lifespan(app):
        # NOTE: the event loop reads the engine's messages itself: a reader thread would wait for
        # the interpreter lock while the loop writes many streams, delaying every token
        loop = asyncio.get_running_loop()
        loop.add_reader(conn.fileno(), _read, conn, service, loop, lambda: server)
        send(("ready", sock.getsockname()[1]))
        yield

    app = create_app(service, lifespan)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    with contextlib.suppress(OSError, EOFError):
        send(("stopped",))


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _read(conn, service: Service, loop, server) -> None:
    """On the event loop: the engine's messages; at "stop" (or the engine gone), shut down."""
    while conn.poll():
        try:
            message = conn.recv()
        except (EOFError, OSError):
            message = ("stop",)
        if message[0] == "stop":
            loop.remove_reader(conn.fileno())
            service.serving = False
            loop.create_task(_shut_down(service, server))
            return
        service.deliver(message)


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
