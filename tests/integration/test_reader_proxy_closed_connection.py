"""An API reader forwards requests to the serving process over pooled Unix-socket
connections. uvicorn closes a connection after an unexpected error's 500 (the exception
goes on past the answer to uvicorn, which logs it, then closes): the reader's next
request, already sent on that pooled connection, failed before any answer, and an
unrelated client got 503 ``server_unavailable``. It must go again on a new connection.

Real uvicorn servers on both sides: a serving app on a Unix socket whose error closes
its connection a moment after the 500 (as the traceback's logging delays it), the
forwarding app on TCP; and the real radserve app, which must keep a connection open
after a 500 it answered."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send
from tests.factories.service import ServerThread, settings_for
from tests.factories.waits import until

from radserve.api import create_app
from radserve.api.proxy import Upstream
from radserve.service import Service


async def _serving(scope: Scope, receive: Receive, send: Send) -> None:
    """``/boom``: a 500, then the error reaches uvicorn (which closes the connection);
    ``/echo?wait=s``: what it was sent, after ``s`` seconds."""
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["path"] == "/boom":
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b'{"error": "boom"}'})
        await asyncio.sleep(0.3)  # the traceback being logged
        raise RuntimeError("an unexpected error in the serving process")
    wait = float(parse_qs(scope["query_string"].decode()).get("wait", ["0"])[0])
    await asyncio.sleep(wait)
    answer = json.dumps({"method": scope["method"], "size": len(body), "head": body[:16].hex()})
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer.encode()})


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[str]:
    socket_path = str(tmp_path / "serving.sock")
    serving = uvicorn.Server(
        uvicorn.Config(_serving, uds=socket_path, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=serving.run, daemon=True)
    thread.start()
    until(lambda: serving.started, "the serving app to start", 30, step=0.02)
    upstream = Upstream(socket_path)
    try:
        # as a reader mounts it: a Starlette app around the forwarding ASGI app
        with ServerThread(Starlette(routes=[Mount("/", app=upstream)])) as front:
            yield front.url
    finally:
        serving.should_exit = True
        thread.join(30)


@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("GET", None),
        ("DELETE", None),
        ("PUT", bytes(range(256)) * 64),  # 16 KiB: sent again from its start
    ],
)
def test_the_request_after_a_500_is_answered_not_503(
    reader: str, method: str, body: bytes | None
) -> None:
    first = httpx.Client(base_url=reader, timeout=30)
    other = httpx.Client(base_url=reader, timeout=30)
    with first, other:
        for round_ in range(3):
            boom = first.get("/boom")
            assert boom.status_code == 500, boom.text
            # still being answered when the serving process closes the connection
            answer = other.request(method, "/echo?wait=0.8", content=body)
            assert answer.status_code == 200, (round_, answer.text)
            sent = body or b""
            assert answer.json() == {"method": method, "size": len(sent), "head": sent[:16].hex()}


def _exchange(connection: socket.socket, path: str) -> bytes:
    """One request on ``connection``; the answer's head and body (Content-Length)."""
    connection.sendall(f"GET {path} HTTP/1.1\r\nHost: radserve\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = connection.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def test_the_serving_app_keeps_its_connection_after_a_500(tmp_path: Path) -> None:
    """The serving app answers an unexpected error with 500 and the connection stays
    good for the next request (a reader's pooled connection is not closed under it)."""
    service = Service(settings_for(tmp_path))
    app: FastAPI = create_app(service)

    async def boom() -> None:
        raise RuntimeError("an unexpected error")

    app.add_api_route("/boom", boom, methods=["GET"])
    with ServerThread(app) as server, socket.create_connection(("127.0.0.1", server.port)) as c:
        c.settimeout(10)
        for _ in range(3):
            answer = _exchange(c, "/boom")
            assert answer.startswith(b"HTTP/1.1 500"), answer[:200]
            assert b'"internal_error"' in answer
            healthy = _exchange(c, "/healthz")
            assert healthy.startswith(b"HTTP/1.1 200"), healthy[:200]
