"""A loopback syslog collector and a certificate for it: the receiving end the critical
bench (``radserve bench --scenario critical``) and the tests (``tests.factories.syslog``)
run radserve's syslog exports against.

RFC 5425 over TLS (given a certificate and key) or RFC 6587 octet counting over plain
TCP; each octet-counted frame becomes one message, :meth:`Collector.parsed` splits
radserve's RFC 5424 messages into their fields. ``close()`` and a new ``Collector`` on
the same port make it go down and come back, as a restarted collector does.

Shutdown is careful: ``close()`` stops the accept loop and every connection's reader
(each polls a stop flag every 0.2 s), waits for the accept loop, then closes the socket,
so nothing keeps the port or a thread after it returns.
"""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import threading
from pathlib import Path

HEADER = re.compile(
    rb"^<(?P<pri>\d+)>1 (?P<ts>\S+) (?P<host>\S+) (?P<app>\S+) (?P<pid>\S+) (?P<msgid>\S+) "
    rb"\[radserve@32473 (?P<sd>[^\]]*)\] \xef\xbb\xbf(?P<body>.*)$",
    re.DOTALL,
)
_POLL_S = 0.2


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed P-256 certificate for 127.0.0.1/localhost, made with the
    ``openssl`` command: (cert, key) PEM files in ``folder``. Raises ``OSError`` (no
    ``openssl``) or ``subprocess.SubprocessError`` (it failed)."""
    cert, key = folder / "collector.pem", folder / "collector.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj",
         "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


class Collector:
    """A syslog receiver on ``127.0.0.1:port`` (0: any free port, see ``.port``): TLS
    (RFC 5425) with ``cert`` + ``key``, else plain TCP. Keeps every message."""

    def __init__(self, port: int = 0, cert: Path | None = None, key: Path | None = None) -> None:
        self.messages: list[bytes] = []
        self.connections = 0
        self.framing_errors = 0  # connections dropped for a frame that is not octet-counted
        self._context: ssl.SSLContext | None = None
        if cert is not None and key is not None:
            self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._context.load_cert_chain(str(cert), str(key))
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen()
        self._sock.settimeout(_POLL_S)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="syslog-collector", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:  # the socket was closed
                return
            threading.Thread(target=self._read, args=(raw,), daemon=True).start()

    def _read(self, raw: socket.socket) -> None:
        conn = raw
        if self._context is not None:
            try:
                conn = self._context.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError):
                raw.close()
                return
        with self._lock:
            self.connections += 1
        buffer = b""
        conn.settimeout(_POLL_S)
        with conn:
            while not self._stop.is_set():
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    continue
                except (ssl.SSLError, OSError):
                    return
                if not chunk:
                    return
                buffer += chunk
                while b" " in buffer:
                    length, _, rest = buffer.partition(b" ")
                    if not length.isdigit():
                        with self._lock:
                            self.framing_errors += 1
                        return
                    if len(rest) < int(length):
                        break
                    with self._lock:
                        self.messages.append(rest[: int(length)])
                    buffer = rest[int(length) :]

    def parsed(self) -> list[dict[str, object]]:
        """Each message's PRI, MSGID, radserve structured data and body. Raises
        ``ValueError`` for a message that is not radserve's RFC 5424 form."""
        with self._lock:
            messages = list(self.messages)
        out = []
        for message in messages:
            match = HEADER.match(message)
            if match is None:
                raise ValueError(f"not a radserve RFC 5424 message: {message[:200]!r}")
            sd = dict(re.findall(rb'(\w+)="((?:[^"\\]|\\.)*)"', match["sd"]))
            out.append({
                "pri": int(match["pri"]), "msgid": match["msgid"].decode(),
                "sd": {k.decode(): v.decode() for k, v in sd.items()}, "body": match["body"],
            })  # fmt: skip
        return out

    def records(self) -> list[dict[str, object]]:
        """The audit records (IHE ATNA: DICOM PS3.15 A.5 or FHIR AuditEvent)."""
        return [m for m in self.parsed() if m["msgid"] in ("IHE+RFC-3881", "IHE+FHIR")]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


__all__ = ["HEADER", "Collector", "make_certificate"]
