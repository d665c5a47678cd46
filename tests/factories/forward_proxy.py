"""A tiny HTTP forward proxy on loopback, as a site's outbound proxy: ``CONNECT host:port``
opens a tunnel (HTTPS), an absolute-form request (``POST http://host:port/path``) is
forwarded to its origin (plain HTTP). Bytes are relayed as they come, in both
directions, so a receiver's slowness reaches the client unchanged; when either side
closes, the other is closed too. ``targets`` lists what each connection asked for."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class ForwardProxy:
    url: str
    targets: list[str] = field(default_factory=list)  # "CONNECT host:port" or "POST url"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def seen(self) -> list[str]:
        with self.lock:
            return list(self.targets)


def _head(conn: socket.socket) -> tuple[bytes, bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either closes; then close both."""
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join(60)


def _serve(proxy: ForwardProxy, client: socket.socket) -> None:
    with client:
        got = _head(client)
        if got is None:
            return
        head, rest = got
        request_line, _, headers = head.partition(b"\r\n")
        method, target, version = request_line.decode("latin-1").split(" ", 2)
        with proxy.lock:
            proxy.targets.append(f"{method} {target}")
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            upstream.settimeout(None)
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            with upstream:
                if rest:
                    upstream.sendall(rest)
                _relay(client, upstream)
            return
        # absolute-form: http://host:port/path -> the origin, asked for /path
        _, _, remainder = target.partition("://")
        authority, slash, path = remainder.partition("/")
        host, _, port = authority.rpartition(":")
        upstream = socket.create_connection((host.strip("[]"), int(port or 80)), timeout=10)
        upstream.settimeout(None)
        with upstream:
            line = f"{method} {slash}{path} {version}".encode("latin-1")
            upstream.sendall(line + b"\r\n" + headers + b"\r\n\r\n" + rest)
            _relay(client, upstream)


@contextmanager
def forward_proxy() -> Iterator[ForwardProxy]:
    """``with forward_proxy() as proxy:`` -> ``proxy.url`` (``http://127.0.0.1:port``)."""
    listener = socket.create_server(("127.0.0.1", 0))
    proxy = ForwardProxy(url=f"http://127.0.0.1:{listener.getsockname()[1]}")
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)  # a closed listener does not wake a blocked accept
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=_serve, args=(proxy, conn), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        stop.set()
        thread.join(5)
        listener.close()
