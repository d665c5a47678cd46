"""An HTTP receiver that answers one byte at a time, a fraction of a second apart: each
read of the client gets something well within any per-read timeout, so only a total
time per attempt ends it. ``hung_up`` is set when the client closes the connection
while bytes were still to come (it gave up); ``finished`` when the whole answer went
out (the client waited for all of it)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from tests.factories.raw_http import loopback_server, read_message

DRIP_EVERY_S = 0.25
# the answer's bytes: ~30 s at DRIP_EVERY_S, well past every timeout the tests set
DRIP_BYTES = 120


@dataclass
class DripServer:
    url: str
    hung_up: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    requests: int = 0


def _answer(phase: Literal["headers", "body"]) -> tuple[bytes, bytes]:
    """(sent at once, dripped)."""
    if phase == "headers":
        drip = b"HTTP/1.1 200 OK\r\nX-Drip: " + b"a" * DRIP_BYTES + b"\r\n"
        return b"", drip + b"Content-Length: 0\r\nConnection: close\r\n\r\n"
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {DRIP_BYTES}\r\nConnection: close\r\n\r\n"
    return head.encode(), b"{" + b" " * (DRIP_BYTES - 2) + b"}"


@contextmanager
def drip_server(
    phase: Literal["headers", "body"] = "headers", *, tls: ssl.SSLContext | None = None
) -> Iterator[DripServer]:
    """``with drip_server() as server:`` -> ``server.url``; the answer's status line and
    headers are dripped (``headers``), or its body after them (``body``). ``tls``: a
    server context, to answer HTTPS."""
    scheme = "http" if tls is None else "https"
    server = DripServer(url="")
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        if tls is not None:
            try:
                conn = tls.wrap_socket(conn, server_side=True)
            except OSError:  # the client gave up during the handshake
                conn.close()
                return
        with conn:
            read_message(conn)
            server.requests += 1
            at_once, dripped = _answer(phase)
            try:
                conn.sendall(at_once)
                for index in range(len(dripped)):
                    if stop.wait(DRIP_EVERY_S):
                        return
                    conn.sendall(dripped[index : index + 1])
            except OSError:  # reset or broken pipe: the client gave up mid-answer
                server.hung_up.set()
                return
            server.finished.set()

    with loopback_server(serve, stop) as port:
        server.url = f"{scheme}://127.0.0.1:{port}/hook"
        yield server
