"""SIGTERM while requests are in flight: a request the stop cuts off is answered 503
``server_unavailable`` in the API's JSON error shape, retryable, with ``Retry-After`` (so
a sender sends it again), the log has one WARNING line for it and no traceback, and
nothing of a cut-off upload is stored.

Before (t-ops #6): with API reader processes, an upload still arriving 5 s after SIGTERM
was cancelled by uvicorn in the reader: the client got a text/plain "Internal Server
Error" 500 and the log a CancelledError traceback from the reader's forwarding call.
Without readers the stop waited for the upload for as long as it trickled in.

A real ``radserve serve`` (with and without readers; an upload and a STOW-RS), and the
reader's forwarding app in-process for what is hard to catch in a real server: a
request waiting for the serving process's answer, and an answer being relayed."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from tests.factories.dicom_net import free_port
from tests.factories.dicomweb import dicom_parts, related
from tests.factories.server_process import create_key_cli, start_server
from tests.factories.service import config_file, make_study
from tests.factories.waits import until

from radserve.api.http_limits import STOP_LINGER_S, bounded_protocol
from radserve.api.proxy import Upstream
from radserve.config import ServerSettings, load_settings
from radserve.store.audited import open_audited

RATE_BYTES_S = 50_000  # the sender's link: the upload takes ~20 s, the stop comes at ~2 s


def _multipart(paths: list[Path]) -> tuple[bytes, str]:
    boundary = "radserve-stop-test"
    parts = [
        b'--%s\r\nContent-Disposition: form-data; name="files"; filename="%s"\r\n'
        b"Content-Type: application/dicom\r\n\r\n%s\r\n"
        % (boundary.encode(), p.name.encode(), p.read_bytes())
        for p in paths
    ]
    body = b"".join(parts) + b"--%s--\r\n" % boundary.encode()
    return body, f"multipart/form-data; boundary={boundary}"


class SlowSender:
    """One request sent at :data:`RATE_BYTES_S` on a raw socket, its answer read as it
    comes (a sender that stops when answered, as curl does)."""

    def __init__(self, port: int, head: bytes, body: bytes) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.head, self.body = head, body
        self.answer = bytearray()
        self.answered = threading.Event()
        self.sent = 0
        threading.Thread(target=self._read, daemon=True).start()
        self._sender = threading.Thread(target=self._send, daemon=True)
        self._sender.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            self.answer.extend(chunk)
        self.answered.set()

    def _send(self) -> None:
        try:
            self.sock.sendall(self.head)
            step = RATE_BYTES_S // 10
            while self.sent < len(self.body) and not self.answered.is_set():
                self.sock.sendall(self.body[self.sent : self.sent + step])
                self.sent += step
                time.sleep(0.1)
        except OSError:
            pass

    def response(self) -> tuple[int, dict[str, str], bytes]:
        head, _, body = bytes(self.answer).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        return int(lines[0].split()[1]), headers, body


@pytest.mark.slow
@pytest.mark.parametrize(("readers", "kind"), [(2, "upload"), (0, "upload"), (2, "stow")], ids=str)
def test_sigterm_during_a_slow_upload_answers_a_retryable_503(
    tmp_path: Path, readers: int, kind: str
) -> None:
    config = config_file(tmp_path, server={"read_processes": readers})
    data, log = tmp_path / "data", tmp_path / "server.log"
    key = create_key_cli(config, data)
    files = make_study(tmp_path / "study", n_slices=40, rows=128, cols=128)
    if kind == "upload":
        body, content_type = _multipart(files)
        target = "/v1/studies"
    else:
        body, content_type = related(dicom_parts(files))
        target = "/dicomweb/studies"
    head = (
        f"POST {target} HTTP/1.1\r\nHost: radserve\r\nAuthorization: Bearer {key}\r\n"
        f"Accept: application/json, application/dicom+json\r\nContent-Type: {content_type}"
        f"\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    port = free_port()
    server = start_server(config, data, port, log)
    try:
        sender = SlowSender(port, head, body)
        until(lambda: sender.sent >= 2 * RATE_BYTES_S, "2 s of the upload", 60, step=0.05)
        server.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        assert sender.answered.wait(60)
        assert server.wait(60) in (0, -signal.SIGTERM)
        stop_s = time.monotonic() - sent_at
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    status, headers, answer = sender.response()
    assert status == 503, bytes(sender.answer)[:500]
    assert headers["content-type"] == "application/json"
    assert int(headers["retry-after"]) > 0
    error = json.loads(answer)["error"]
    assert error["code"] == "server_unavailable" and error["retryable"] is True
    assert sender.sent < len(body)  # cut off, not finished
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and "Exception in ASGI" not in text, text[-3000:]
    assert "Cancel " not in text  # uvicorn's own cancel of what was left
    cut = [line for line in text.splitlines() if "cut off" in line]
    assert len(cut) == 1 and '"warning"' in cut[0], cut
    # nothing of it stored: no study folder, no job
    studies = data / "studies"
    assert not studies.exists() or not any(p.is_file() for p in studies.rglob("*"))
    store, _ = open_audited(load_settings(config, data_dir=data))
    try:
        assert store.list_jobs(limit=10).items == []
    finally:
        store.close()
    print(f"readers={readers} {kind}: stop took {stop_s:.1f} s")


# --- the reader's forwarding app, in-process -------------------------------------------


async def _serving(scope: Scope, receive: Receive, send: Send) -> None:
    """``/slow``: answers after 60 s; ``/stream``: a first chunk, then one every 60 s."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(60)
    headers = [(b"content-type", b"text/plain")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    while True:
        await send({"type": "http.response.body", "body": b"x" * 100, "more_body": True})
        if scope["path"] != "/stream":
            break
        await asyncio.sleep(60)
    await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[tuple[uvicorn.Server, int, threading.Thread]]:
    """A serving app on a Unix socket and, on TCP, the reader's forwarding app served as
    a reader serves it (its protocol cutting every request still running at the stop),
    with a 1 s grace."""
    socket_path = str(tmp_path / "serving.sock")
    serving = uvicorn.Server(
        uvicorn.Config(_serving, uds=socket_path, log_config=None, access_log=False)
    )
    threading.Thread(target=serving.run, daemon=True).start()
    until(lambda: serving.started, "the serving app to start", 30, step=0.02)
    grace = 1.0
    protocol = type("P", (bounded_protocol(ServerSettings(), stop_cuts_all=True),), {})
    protocol.stop_grace_s = grace
    sock = socket.create_server(("127.0.0.1", 0))
    front = uvicorn.Server(
        uvicorn.Config(
            Upstream(socket_path),
            http=protocol,
            ws="none",
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=grace + STOP_LINGER_S + 1,  # as radserve.api.reader
        )
    )
    thread = threading.Thread(target=front.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    until(lambda: front.started, "the reader app to start", 30, step=0.02)
    try:
        yield front, sock.getsockname()[1], thread
    finally:
        front.should_exit = True
        serving.should_exit = True
        thread.join(30)
        sock.close()


def test_a_reader_stopping_answers_a_forwarded_request_still_waiting_503(
    reader: tuple[uvicorn.Server, int, threading.Thread], caplog: pytest.LogCaptureFixture
) -> None:
    front, port, thread = reader
    waiting = socket.create_connection(("127.0.0.1", port))
    waiting.sendall(b"GET /slow HTTP/1.1\r\nHost: r\r\n\r\n")
    streaming = socket.create_connection(("127.0.0.1", port))
    streaming.sendall(b"GET /stream HTTP/1.1\r\nHost: r\r\n\r\n")
    assert b"200" in streaming.recv(65536)  # the answer is being relayed
    time.sleep(0.3)  # the waiting request forwarded
    with caplog.at_level(logging.INFO):
        front.should_exit = True
        waiting.settimeout(30)
        answer = b""
        while chunk := waiting.recv(65536):
            answer += chunk
        streaming.settimeout(30)
        while streaming.recv(65536):  # closed mid-answer
            pass
        thread.join(30)  # the reader's server stopped (no request left for uvicorn to cancel)
        assert not thread.is_alive()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer[:300]
    assert b"retry-after: " in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "server_unavailable" and error["retryable"] is True
    logged = [r for r in caplog.records if r.name.startswith(("uvicorn", "radserve"))]
    assert not [r for r in logged if r.exc_info or r.levelno >= logging.ERROR], [
        r.getMessage() for r in logged
    ]
    cut = [r.getMessage() for r in logged if "cut off" in r.getMessage()]
    assert len(cut) == 1 and "1 answered 503" in cut[0] and "1 closed" in cut[0], cut
