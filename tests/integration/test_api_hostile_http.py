"""Malformed HTTP requests against the real server (uvicorn on loopback, raw sockets
where a client library would refuse to send them): each gets a clear 4xx with the JSON
error body (whether the parser, the framework or a route refused it), never a 500, and
the server goes on serving."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.factories.service import live_server, make_study, settings_for

STOW = 'multipart/related; type="application/dicom"; boundary='


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("hostile-http")
    with live_server(settings_for(root)) as live:
        yield {**live, "dicom": make_study(root / "study", n_slices=2)[0].read_bytes()}


def send(live: dict[str, Any], raw: bytes, *, half_close: bool = False) -> tuple[int, bytes]:
    """Send ``raw`` as it is; the status code and body of the answer (0: no answer)."""
    with socket.create_connection(("127.0.0.1", live["port"]), timeout=30) as sock:
        try:
            sock.sendall(raw)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading it all: read the answer
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            length = [
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            if sep and length and len(body) >= length[0]:
                break
    if not data.startswith(b"HTTP/1.1 "):
        return 0, data
    return int(data[9:12]), data.partition(b"\r\n\r\n")[2]


def request(
    live: dict[str, Any],
    path: str,
    *,
    method: str = "POST",
    content_type: str | None = None,
    body: bytes = b"",
    length: int | None = None,
    key: str = "submit",
    extra: bytes = b"",
    half_close: bool = False,
) -> tuple[int, bytes]:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += f"Authorization: Bearer {live[key]}\r\n"
    if content_type is not None:
        head += f"Content-Type: {content_type}\r\n"
    head += f"Content-Length: {len(body) if length is None else length}\r\n"
    return send(live, head.encode("latin-1") + extra + b"\r\n" + body, half_close=half_close)


def part(data: bytes, boundary: str = "b") -> bytes:
    return f"--{boundary}\r\nContent-Type: application/dicom\r\n\r\n".encode() + data + b"\r\n"


def close(boundary: str = "b") -> bytes:
    return f"--{boundary}--\r\n".encode()


CASES: dict[str, tuple[dict[str, Any], set[int]]] = {}


def case(name: str, allowed: set[int], **kwargs: Any) -> None:
    CASES[name] = (kwargs, allowed)


DICOM = b"DICM"  # replaced by the real file in the test
case(
    "stow: no boundary parameter",
    {400},
    content_type='multipart/related; type="application/dicom"',
    body=part(DICOM) + close(),
)
case(
    "stow: body framed with another boundary",
    {400},
    content_type=STOW + "other",
    body=part(DICOM) + close(),
)
case(
    "stow: 500-character boundary",
    {400},
    content_type=STOW + "x" * 500,
    body=part(DICOM, "x" * 500) + close("x" * 500),
)
case(
    "stow: non-ASCII boundary", {400}, content_type=STOW + "b\xe9", body=part(DICOM, "b") + close()
)
case("stow: empty boundary in quotes", {400}, content_type=STOW + '""', body=b"----\r\n")
case("stow: text/plain", {415}, content_type="text/plain", body=b"hello")
case("stow: no content type", {415}, body=part(DICOM) + close())
case(
    "stow: multipart/related of XML",
    {415},
    content_type='multipart/related; type="application/dicom+xml"; boundary=b',
    body=part(DICOM) + close(),
)
case("stow: ends mid-part", {400}, content_type=STOW + "b", body=part(DICOM)[:-30])
case(
    "stow: 100 KiB of part headers",
    {400},
    content_type=STOW + "b",
    body=b"--b\r\nX-Junk: " + b"j" * 100_000 + b"\r\n\r\nx\r\n" + close(),
)
case(
    "stow: 1 MiB preamble and no delimiter",
    {400},
    content_type=STOW + "b",
    body=b"preamble " * 120_000,
)
case("stow: only a close delimiter", {400}, content_type=STOW + "b", body=close())
case(
    "upload: form-data without boundary",
    {400, 415},
    content_type="multipart/form-data",
    body=b"--x\r\n\r\n--x--\r\n",
)
case(
    "upload: form-data with a broken header line",
    {400, 415, 422},
    content_type="multipart/form-data; boundary=x",
    body=b"--x\r\nContent-Disposition form-data\r\n\r\nabc\r\n--x--\r\n",
)
case(
    "upload: JSON instead of files",
    {400, 415, 422},
    content_type="application/json",
    body=b'{"files": []}',
)
case(
    "stow: body shorter than Content-Length, client gone",
    {400, 0},
    content_type=STOW + "b",
    body=part(DICOM)[:200],
    length=10_000_000,
    half_close=True,
)
case("stow: negative Content-Length", {400, 0}, content_type=STOW + "b", body=b"", length=-5)
case(
    "qido: 64 KiB query", {400, 414, 431, 0}, method="GET", key="read", content_type=None, body=b""
)  # path set in the test
case(
    "any: 100 KiB request header",
    {431},
    method="GET",
    key="read",
    extra=b"X-Junk: " + b"h" * 100_000 + b"\r\n",
)
case(
    "any: 20 MiB request header",
    {431, 0},
    method="GET",
    key="read",
    extra=b"X-Junk: " + b"h" * (20 << 20) + b"\r\n",
)
case(
    "any: 10,000 small headers",
    {431},
    method="GET",
    key="read",
    extra=b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)),
)
case("wado: NUL and traversal in a UID", {400, 404}, method="GET", key="read")
case("jobs: NUL in a job id", {400}, method="GET", key="read")
case("jobs: CR LF in a query value", {400}, method="GET", key="read")
case("jobs: NUL in a job id to cancel", {400}, method="DELETE")
case("any: WebSocket upgrade (the API has none)", {401}, method="GET")  # raw, below
case("any: WebDAV method", {405}, method="PROPFIND", key="read")
case("any: a method the parser refuses", {400}, method="FOO", key="read")
case("any: non-ASCII byte in the path", {400}, method="GET", key="read")
case("any: obsolete header folding", {400}, method="GET", key="read", extra=b"X-A: a\r\n b\r\n")
case(
    "any: Content-Length and chunked together",
    {400},
    content_type=STOW + "b",
    extra=b"Transfer-Encoding: chunked\r\n",
    body=b"0\r\n\r\n",
)
case("any: unknown path", {404}, method="GET", key="read")
case("any: trailing slash (no redirect to the Host sent)", {404}, method="GET", key="read")
case(
    "batch: 101 studies in one request",
    {400},
    content_type="multipart/form-data; boundary=b",
    body=b"".join(
        b'--b\r\nContent-Disposition: form-data; name="s%d"; filename="x"\r\n\r\nx\r\n' % i
        for i in range(101)
    )
    + close(),
)
case("auth: Bearer without a token", {401}, method="GET", key="read")


PATHS = {
    "upload": "/v1/studies",
    "qido: 64 KiB query": "/dicomweb/studies?PatientID=" + "a" * 65536,
    "any: 100 KiB request header": "/dicomweb/studies",
    "any: 20 MiB request header": "/dicomweb/studies",
    "any: 10,000 small headers": "/dicomweb/studies",
    "wado: NUL and traversal in a UID": "/dicomweb/studies/1.2%00.3%2F..%2F..%2Fetc/metadata",
    "auth: Bearer without a token": "/dicomweb/studies",
    "jobs: NUL in a job id": "/v1/jobs/a%00b",
    "jobs: CR LF in a query value": "/v1/jobs?pipeline=x%0d%0aSet-Cookie:%20a",
    "jobs: NUL in a job id to cancel": "/v1/jobs/%00",
    "any: WebSocket upgrade (the API has none)": "/v1/jobs",
    "any: WebDAV method": "/v1/jobs",
    "any: a method the parser refuses": "/v1/jobs",
    "any: non-ASCII byte in the path": "/v1/jobs/\xe9",
    "any: obsolete header folding": "/v1/jobs",
    "any: unknown path": "/v2/nothing",
    "any: trailing slash (no redirect to the Host sent)": "/v1/jobs/",
    "batch: 101 studies in one request": "/v1/studies/batch",
}


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_request_gets_a_clear_4xx(
    live: dict[str, Any], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    kwargs, allowed = CASES[name]
    kwargs = dict(kwargs)
    kwargs["body"] = kwargs.get("body", b"").replace(DICOM, live["dicom"][:3000])
    path = PATHS.get(name) or PATHS.get(name.split(":")[0], "/dicomweb/studies")
    if name == "auth: Bearer without a token":
        status, body = send(
            live,
            b"GET /dicomweb/studies HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\r\n"
            b"Connection: close\r\n\r\n",
        )
    elif name == "any: WebSocket upgrade (the API has none)":  # answered as HTTP: no key
        status, body = send(
            live,
            b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n",
        )
    else:
        status, body = request(live, path, **kwargs)
    assert status in allowed, (name, status, body[:300])
    if status:
        assert status < 500
    if status >= 400:  # whoever refused it (parser, framework, route): the JSON error body
        error = json.loads(body)["error"]
        assert error["code"] and error["message"], (name, body[:300])
    # the server is still there, and logged no unexpected error
    assert send(live, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")[0] == 200
    assert not [r for r in caplog.records if "unexpected" in r.getMessage()]


def _peak_rss_mb(reset: bool = False) -> int:
    """This process's peak RSS (the server runs in it, on a thread); ``reset`` starts a
    new peak from the present RSS (Linux ``clear_refs``)."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) >> 10


@pytest.mark.parametrize(
    ("path", "content_type", "part_head"),
    [
        ("/v1/studies", "multipart/form-data; boundary=b", 'form-data; name="files"; filename="x"'),
        ("/dicomweb/studies", STOW + "b", None),
    ],
)
def test_many_parts_under_the_spool_size_do_not_all_stay_in_memory(
    live: dict[str, Any], path: str, content_type: str, part_head: str | None
) -> None:
    """300 parts of 1 MiB - 1 byte, each under the parsers' 1 MiB spool size, all stayed
    in memory: the server's peak RSS rose by ~305 MB (an upload up to 2 GiB could hold
    that much). Past a request's 64 MiB in memory (radserve.spool) parts go to disk."""
    head = b"--b\r\nContent-Type: application/dicom\r\n"
    if part_head is not None:
        head += f"Content-Disposition: {part_head}\r\n".encode()
    part = head + b"\r\n" + b"\0" * ((1 << 20) - 1) + b"\r\n"
    body = part * 300 + close()
    request_head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: Bearer {live['submit']}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    before = _peak_rss_mb(reset=True)
    with socket.create_connection(("127.0.0.1", live["port"]), timeout=60) as sock:
        sock.sendall(request_head)
        sock.sendall(body)  # not joined to the head: no second copy in this process
        answer = sock.recv(65536)
    grew = _peak_rss_mb() - before
    assert answer.startswith((b"HTTP/1.1 415", b"HTTP/1.1 409")), answer[:300]  # all parsed
    assert grew < 160, f"the server's peak RSS rose {grew} MB for 300 MB of parts"


def test_a_burst_of_refused_requests_is_counted_not_logged_line_by_line(
    live: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn logged a warning per request its parser refused, and two per Upgrade header
    (one telling to install a WebSocket library): a client chose how many lines the server
    wrote. Now at most one line per 10 s per kind, with the count."""
    caplog.set_level(logging.WARNING)
    for _ in range(30):
        assert send(live, b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 400
        upgrade = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\n"
        assert send(live, upgrade + b"Upgrade: h2c\r\n\r\n")[0] == 200
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "parser refused" in m]) <= 1, lines
    assert len([m for m in lines if "upgrade the protocol" in m]) <= 1, lines
    assert not [m for m in lines if "WebSocket library" in m or "Invalid HTTP" in m], lines


LONG = "j" * 60_000  # a request head holds up to 64 KiB


@pytest.mark.parametrize(
    "path",
    [
        f"/v1/jobs/{LONG}",  # no job with id '…'
        f"/v1/jobs/{LONG}/report",
        f"/dicomweb/studies?StudyDate={LONG}",  # not a DICOM date
        f"/dicomweb/studies?{LONG}=1",  # not a DICOM keyword
        f"/dicomweb/studies?limit={LONG}",  # not a non-negative integer
    ],
)
def test_error_messages_quote_at_most_64_characters_of_the_request(
    live: dict[str, Any], path: str
) -> None:
    """A message that quotes what the client sent quotes its first 64 characters and
    "…" (radserve.errors.quoted): a 60,000-character job id came back whole."""
    status, body = request(live, path, method="GET", key="read")
    assert 400 <= status < 500, (status, body[:300])
    message = json.loads(body)["error"]["message"]
    assert f"'{LONG[:64]}…'" in message
    assert len(message) < 400, message


def _dicom_part(live: dict[str, Any], media: str = "application/dicom") -> bytes:
    return f"--b\r\nContent-Type: {media}\r\n\r\n".encode() + live["dicom"] + b"\r\n"


@pytest.mark.parametrize(
    ("name", "kwargs", "status", "code", "words"),
    [
        ("empty body", {"content_type": STOW + "b"}, 400, "empty_upload", "body is empty"),
        (
            "body framed with another boundary",
            {"content_type": STOW + "zz", "body": part(DICOM) + close()},
            400,
            "invalid_request",
            "no delimiter of the boundary",
        ),
        (
            "body cut mid-part",
            {"content_type": STOW + "b", "body": part(DICOM)[:-30]},
            400,
            "upload_incomplete",
            "cut short",
        ),
        (
            "gzip Content-Encoding",
            {
                "content_type": STOW + "b",
                "body": part(DICOM) + close(),
                "extra": b"Content-Encoding: gzip\r\n",
            },
            415,
            "unsupported_media_type",
            "Content-Encoding 'gzip'",
        ),
        (
            "one DICOM file as the body (not multipart)",
            {"content_type": "application/dicom", "body": DICOM},
            415,
            "unsupported_media_type",
            "send multipart/related",
        ),
    ],
)
def test_a_stow_request_refused_as_a_whole_says_why_by_code(
    live: dict[str, Any], name: str, kwargs: dict[str, Any], status: int, code: str, words: str
) -> None:
    """An empty body and one framed with another boundary were answered
    `upload_incomplete` "the upload was cut short; send it again" (sending it again cannot
    help), and a gzip body was parsed as if it were plain."""
    kwargs = {**kwargs, "body": kwargs.get("body", b"").replace(DICOM, live["dicom"])}
    got, body = request(live, "/dicomweb/studies", **kwargs)
    error = json.loads(body)["error"]
    assert (got, error["code"]) == (status, code), (name, body[:300])
    assert words in error["message"], (name, error["message"])


def test_a_part_of_another_media_type_fails_with_a_code(live: dict[str, Any]) -> None:
    """A text/plain part beside a DICOM one: 202, that part's failed item carries radserve's
    code (0009,1001), as the per-instance failures do. (The study is left to the quiet
    period: a whole study of one image is refused at the door since 2026-12-07, as its job
    would fail for too few images.)"""
    body = _dicom_part(live) + _dicom_part(live, "text/plain") + close()
    status, answer = request(
        live, "/dicomweb/studies?complete=false", content_type=STOW + "b", body=body
    )
    assert status == 202, answer[:300]
    (item,) = json.loads(answer)["00081198"]["Value"]
    assert item["00081197"]["Value"] == [0xC000]
    assert item["00091001"]["Value"] == ["unsupported_media_type"]


def _answers(sock: socket.socket) -> list[int]:
    """The statuses of the answers read until the server closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return [int(part[:3]) for part in data.split(b"HTTP/1.1 ")[1:]]


@pytest.mark.parametrize("kept_alive", [False, True])
def test_a_head_over_the_bound_is_refused_in_whatever_pieces_it_comes(
    live: dict[str, Any], kept_alive: bool
) -> None:
    """The head's bytes were counted from the parser's start of the message, which it
    reaches inside the feed of the head's first piece: that piece was forgotten, and a
    100 KiB head in two pieces was answered 200 (a CI run on a loaded host). On a
    kept-alive connection the next request's first piece was not counted either."""
    head = (
        (
            f"GET /dicomweb/studies HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {live['read']}\r\n"
        ).encode()
        + b"X-Junk: "
        + b"h" * 100_000
        + b"\r\n\r\n"
    )
    small = f"GET /dicomweb/studies HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {live['read']}"
    with socket.create_connection(("127.0.0.1", live["port"]), timeout=30) as sock:
        if kept_alive:
            sock.sendall(small.encode() + b"\r\n\r\n")
            time.sleep(0.3)  # answered before the next request starts
        for piece in (head[:50_000], head[50_000:]):  # each under the bound, the two over
            sock.sendall(piece)
            time.sleep(0.3)  # apart: the server reads them as two
        answers = _answers(sock)
    assert answers == ([200, 431] if kept_alive else [431])
    # and a head under the bound, in pieces, is served
    ok = head.replace(b"h" * 100_000, b"h" * 30_000).replace(
        b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", live["port"]), timeout=30) as sock:
        for piece in (ok[:20_000], ok[20_000:]):
            sock.sendall(piece)
            time.sleep(0.3)
        assert _answers(sock) == [200]
