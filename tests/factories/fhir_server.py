"""A real FHIR endpoint stand-in for delivery tests: an HTTP server on 127.0.0.1 that
records every POST and answers from a script (status, body, delay), and that can go
down and come back on the same port."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.factories.ports import free_port


@dataclass(frozen=True)
class Answer:
    status: int = 200
    body: dict[str, Any] | None = None
    delay_s: float = 0.0
    # the answer's bytes as they are (``body`` ignored), and its Content-Type
    raw: bytes | None = None
    content_type: str = "application/fhir+json"
    headers: tuple[tuple[str, str], ...] = ()  # more header lines (e.g. Retry-After)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _State:
    script: deque[Answer] = field(default_factory=deque)
    received: list[Received] = field(default_factory=list)
    connections: int = 0  # TCP connections accepted
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: _State, keep_alive: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0 closes the connection after each answer; 1.1 keeps it for the next
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def setup(self) -> None:
            super().setup()
            with state.lock:
                state.connections += 1

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            with state.lock:
                state.received.append(Received(self.path, dict(self.headers.items()), body))
                answer = state.script.popleft() if state.script else Answer()
            if answer.delay_s:
                time.sleep(answer.delay_s)
            payload = answer.raw
            if payload is None:
                payload = json.dumps(
                    answer.body
                    if answer.body is not None
                    else {"resourceType": "Bundle", "type": "transaction-response", "entry": []}
                ).encode()
            try:
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in answer.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except OSError:  # the client gave up (a timeout test)
                pass

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    return Handler


class FhirServer:
    """``with FhirServer() as fhir:`` -> ``fhir.url``; ``down()`` / ``up()`` stop and
    restart it on the same port; ``script(Answer(...), ...)`` sets the next answers.
    ``keep_alive``: answer HTTP/1.1 and keep each connection (``connections`` counts
    them); else HTTP/1.0, a connection per request."""

    def __init__(self, *, keep_alive: bool = False) -> None:
        self.keep_alive = keep_alive
        self.port = free_port()  # restarts bind it again: never an ephemeral port
        self.url = f"http://127.0.0.1:{self.port}/fhir"
        self._state = _State()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def received(self) -> list[Received]:
        with self._state.lock:
            return list(self._state.received)

    @property
    def connections(self) -> int:
        with self._state.lock:
            return self._state.connections

    def script(self, *answers: Answer) -> None:
        with self._state.lock:
            self._state.script.extend(answers)

    def up(self) -> None:
        assert self._server is None, "already up"
        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(
            ("127.0.0.1", self.port), _handler(self._state, self.keep_alive)
        )
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FhirServer:
        self.up()
        return self

    def __exit__(self, *_: object) -> None:
        self.down()
