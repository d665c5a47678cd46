"""A TCP relay in front of a real DICOM receiver that records when each connection (one
DICOM association) opened and closed: which associations to one receiver overlapped.

It relays bytes both ways unchanged, so the receiver (dcmtk's storescp) answers every
association itself; a connection's interval runs from its accept to the sender's side
closing (a release, an abort, or the sender's process killed).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass


@dataclass
class Association:
    opened: float  # time.monotonic()
    closed: float | None = None


class AssociationLog:
    """Listens on ``port`` (``127.0.0.1``) and relays each connection to
    ``127.0.0.1:target``; setting ``target`` sends the connections accepted after to
    another receiver (the same destination, a quicker one). Use as a context manager."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self.associations: list[Association] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> AssociationLog:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._server.close()

    def overlaps(self) -> list[tuple[Association, Association]]:
        """Pairs of associations that were open at the same time (an open one counts as
        open until now)."""
        now = time.monotonic()
        with self._lock:
            spans = sorted(self.associations, key=lambda a: a.opened)
        return [
            (first, second)
            for i, first in enumerate(spans)
            for second in spans[i + 1 :]
            if second.opened < (first.closed if first.closed is not None else now)
        ]

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            association = Association(time.monotonic())
            with self._lock:
                self.associations.append(association)
            threading.Thread(target=self._relay, args=(client, association), daemon=True).start()

    def _relay(self, client: socket.socket, association: Association) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
        except OSError:
            client.close()
            association.closed = time.monotonic()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)  # until the sender's side closes
        association.closed = time.monotonic()
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        back.join(10)
        client.close()
        upstream.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    while True:
        try:
            chunk = source.recv(65536)
        except OSError:
            return
        if not chunk:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
            return
        try:
            sink.sendall(chunk)
        except OSError:
            return
