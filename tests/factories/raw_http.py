"""Loopback receivers the tests script byte by byte (a misbehaving webhook, a dripping
answer, a closed connection): the listener, and one HTTP/1.1 message read off a socket."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def loopback_server(
    handle: Callable[[socket.socket], None], stop: threading.Event
) -> Iterator[int]:
    """A listener on 127.0.0.1 (its port yielded) whose connections are each given to
    ``handle`` on a thread of their own, until the block ends; then ``stop`` is set (a
    handler waiting on it ends) and the listener closed."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        listener.settimeout(0.2)  # a closed listener does not wake a blocked accept
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def read_message(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """The next message's head (start line and headers) and its body (Content-Length
    bytes, fewer when the peer closed first); None when it closed before the head."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body
