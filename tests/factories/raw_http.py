"""One HTTP/1.1 message read off a raw socket, for the loopback receivers the tests
script byte by byte (a misbehaving webhook, a dripping answer, a closed connection)."""

from __future__ import annotations

import socket


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
