"""The messages between the engine's process and the HTTP process, over one socket: pickles
framed as `multiprocessing.connection` frames them (a 4-byte big-endian length, or -1 and 8
bytes past 2 GiB; then the pickle), so the handshake before serving is a plain `Connection`'s.

Once serving, neither side waits on the other: each reads what has arrived and handles the whole
messages in it (a message in part waits for the rest), and a message the socket cannot take yet
waits in the sender's process: in `Channel`'s outbox on the engine's side, in the asyncio
transport on the HTTP side (`front.EngineLink`).
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import struct
import time

_BIG = 0x7FFFFFFF  # a length this long or longer is written as -1 and 8 bytes


def encode(message: tuple) -> bytes:
    """One message as its frame."""
    data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    size = len(data)
    header = struct.pack("!i", size) if size < _BIG else struct.pack("!iQ", -1, size)
    return header + data


class Frames:
    """Bytes in, whole messages out."""

    def __init__(self) -> None:
        self._received = bytearray()

    def feed(self, data: bytes) -> list[tuple]:
        received, start, messages = self._received, 0, []
        received += data
        while len(received) - start >= 4:
            (size,) = struct.unpack_from("!i", received, start)
            body = start + 4
            if size == -1:
                if len(received) - start < 12:
                    break
                (size,) = struct.unpack_from("!Q", received, body)
                body += 8
            if len(received) - body < size:
                break
            messages.append(pickle.loads(received[body : body + size]))
            start = body + size
        del received[:start]
        return messages


class Channel:
    """The engine's end of the socket, which never blocks the engine's thread: `receive` gives
    the whole messages that have arrived, `send` writes what the socket takes and keeps the
    rest (`pending`) for the next `send` or `flush`. `conn`: the handshake's `Connection`, whose
    socket this shares (close both)."""

    def __init__(self, conn) -> None:
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))
        self._sock.setblocking(False)
        self._frames = Frames()
        self._out = bytearray()
        self.closed = False  # the other end is gone

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def pending(self) -> int:
        """Bytes in the outbox: sent, not yet taken by the socket."""
        return len(self._out)

    def receive(self) -> list[tuple]:
        messages: list[tuple] = []
        while not self.closed:
            try:
                data = self._sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            messages += self._frames.feed(data)
        return messages

    def send(self, message: tuple) -> None:
        """Queue a message and write what the socket takes; OSError once the other end is gone."""
        self._out += encode(message)
        self.flush()

    def flush(self) -> None:
        out = self._out
        while out:
            try:
                sent = self._sock.send(out)
            except (BlockingIOError, InterruptedError):
                return
            del out[:sent]

    def finish(self, timeout_s: float) -> bool:
        """Wait (up to `timeout_s`) until every queued byte is written; whether they were."""
        deadline = time.monotonic() + timeout_s
        self.flush()
        while self._out and (left := deadline - time.monotonic()) > 0:
            select.select([], [self._sock], [], left)
            self.flush()
        return not self._out

    def close(self) -> None:
        self._sock.close()
