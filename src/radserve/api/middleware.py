"""ASGI middleware: request body limit, request timeouts, HTTP metrics.

Plain ASGI (no ``BaseHTTPMiddleware``): nothing is buffered, and the cost per request
is a few attribute lookups.

- Body limit: a declared ``Content-Length`` over the limit is refused with 413 before a
  byte is read; otherwise the bytes are counted as they stream in and the upload is
  stopped (413) the moment it passes the limit, so a huge upload is never held whole.
- Truncation: a multipart body that ends without its closing boundary (a client that
  stopped mid-file) is refused (400) instead of being parsed as a shorter file; an empty
  body (``empty_upload``) and one without a single delimiter of its boundary (framed
  with another boundary, or not multipart: ``invalid_request``) are named as such,
  since sending them again cannot help.
- Content coding: a body with a ``Content-Encoding`` other than ``identity`` is refused
  (415) before a byte is read: radserve does not decode request bodies, and a gzip body
  was parsed as if it were plain.
- Timeouts: a request body that stalls for ``request_timeout_s`` is dropped (408); any
  other request that takes longer gets 504 (uploads are exempt: storing a large study
  takes the time it takes, but only while its bytes keep coming).
- HEAD: answered as the GET of the same URL without its body.
- Error bodies: every 4xx/5xx leaves with the API's JSON error body, whoever wrote it.
- Request targets: a path or query with a control character is refused (400).
- Response policy: every answer of the API, the console's API and DICOMweb (reports,
  FHIR, label maps, images, volumes, result files, job lists and details: patient data
  or results) says ``Cache-Control: no-store`` unless it set its own; every answer to
  a request whose scheme is https (TLS, or a trusted proxy's ``X-Forwarded-Proto``)
  carries ``Strict-Transport-Security``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radserve.api.errors import (
    RequestTimeoutError,
    UploadIncompleteError,
    code_for_status,
    error_body,
)
from radserve.errors import EmptyUploadError, InvalidRequestError, quoted
from radserve.media_types import MediaType, is_json
from radserve.store.files import UploadTooLargeError

Observe = Callable[[str, str, int, float], None]
_TAIL = 4096  # bytes of the body end searched for the closing boundary


async def _send_error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps(error_body(code, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_bytes: int, idle_timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.idle_timeout_s = idle_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _send_error(
                send,
                413,
                "upload_too_large",
                f"the request declares {declared} bytes, over the limit of {self.max_bytes} "
                "(server.max_upload_bytes); send fewer or smaller files",
            )
            return
        coding = _header(scope, b"content-encoding")
        if coding is not None and coding.strip().lower() not in (b"", b"identity"):
            await _send_error(
                send,
                415,
                "unsupported_media_type",
                f"Content-Encoding {quoted(coding.decode('latin-1'))} is not supported: "
                "send the body unencoded (radserve decodes no request body)",
            )
            return
        seen = 0
        limit, idle = self.max_bytes, self.idle_timeout_s
        closing = _closing_delimiter(scope)
        tail = b""
        framed = False  # whether a delimiter of the boundary was seen

        async def limited() -> Message:
            nonlocal seen, tail, framed
            try:
                with anyio.fail_after(idle):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeoutError(
                    f"no request bytes for {idle:.0f} s (server.request_timeout_s); "
                    "the upload was dropped"
                ) from None
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                seen += len(chunk)
                if seen > limit:
                    raise UploadTooLargeError(
                        f"upload exceeds the limit of {limit} bytes (server.max_upload_bytes); "
                        "send fewer or smaller files"
                    )
                if closing is not None:
                    window = tail + chunk
                    framed = framed or closing[:-2] in window
                    tail = window[-_TAIL:]
                    if not message.get("more_body", False) and closing not in tail:
                        _refuse_unclosed(seen, framed, closing)
            return message

        await self.app(scope, limited, send)


class HeadAsGetMiddleware:
    """HEAD answered as GET, headers only (RFC 9110 9.3.2: a server that supports GET
    MUST support HEAD). FastAPI's ``@router.get`` routes take GET alone, so ``curl -I``
    on a report, a monitor's ``HEAD /healthz`` or a download manager's size check got
    405. The app sees a GET; the body is replaced by an empty one here (uvicorn drops it
    as well, from its own scope, which still says HEAD). The GET's side effects happen
    (a HEAD of patient data is audited as a read, like the GET)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


class TimeoutMiddleware:
    def __init__(self, app: ASGIApp, *, timeout_s: float, exempt: tuple[str, ...]) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.exempt):
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        with anyio.move_on_after(self.timeout_s) as scope_:
            await self.app(scope, receive, tracking)
        if scope_.cancelled_caught and not started:
            await _send_error(
                send,
                504,
                "request_timeout",
                f"the request took longer than {self.timeout_s:.0f} s (server.request_timeout_s)",
            )


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BYTES = re.compile(rb"[\x00-\x1f\x7f]")


class ControlCharactersMiddleware:
    """400 for a request whose path or query holds a control character once decoded
    (``%00``, ``%0d%0a``, ...): none belongs in a job id, UID, model name or filter, and
    each reached the database as it came (PostgreSQL refuses NUL in a text: a job id of
    ``%00`` or ``?pipeline=%00`` was a 500 there)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            query = scope.get("query_string", b"")
            if _CONTROL.search(scope["path"]) or (
                b"%" in query and _CONTROL_BYTES.search(unquote_to_bytes(query))
            ):
                await _send_error(
                    send,
                    400,
                    "invalid_request",
                    "the path or query holds a control character (such as %00 or %0A); "
                    "ids, UIDs and filters never do",
                )
                return
        await self.app(scope, receive, send)


class JsonErrorsMiddleware:
    """Every error answer in the API's JSON error body, whoever wrote it: Starlette's
    ``FileResponse`` answers a range past the end with an empty text/plain 416 (and an
    unparsable one with a text/plain 400), and a framework default may answer text. An
    error that is not JSON (``application/json`` or ``+json``) is rewritten: the status
    and headers kept (``Content-Range``, ``Allow``, ``Retry-After``), its text (at most
    :data:`_KEPT_TEXT` bytes, printable) or the status's phrase as the message."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        text = b""

        async def uniform(message: Message) -> None:
            nonlocal held, text
            if message["type"] == "http.response.start":
                if message["status"] >= 400 and not _json_typed(message.get("headers", ())):
                    held = message
                    return
            elif held is not None and message["type"] == "http.response.body":
                text = (text + message.get("body", b""))[:_KEPT_TEXT]
                if not message.get("more_body", False):
                    await _send_rewritten(send, held, text)
                return
            await send(message)

        await self.app(scope, receive, uniform)


_KEPT_TEXT = 512
_MESSAGES = {416: "the Range header asks for bytes past the end; Content-Range gives the size"}
_DROPPED = (b"content-type", b"content-length", b"transfer-encoding")


def _json_typed(headers: Any) -> bool:
    for name, value in headers:
        if bytes(name).lower() == b"content-type":
            return is_json(MediaType.parse(bytes(value).decode("latin-1")).type)
    return False


async def _send_rewritten(send: Send, start: Message, text: bytes) -> None:
    status = start["status"]
    said = text.decode("utf-8", "replace").strip()
    if not said or not said.isprintable():
        said = _MESSAGES.get(status) or HTTPStatus(status).phrase
    body = json.dumps(error_body(code_for_status(status), said)).encode()
    headers = [(k, v) for k, v in start.get("headers", ()) if bytes(k).lower() not in _DROPPED]
    headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class MetricsMiddleware:
    """Counts and times every request by route *template* (bounded label values)."""

    def __init__(self, app: ASGIApp, *, observe: Observe) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def tracking(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        finally:
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.observe(scope["method"], template, status, time.perf_counter() - t0)


def _refuse_unclosed(seen: int, framed: bool, closing: bytes) -> None:
    """Why a multipart body that ended without its close delimiter is refused: empty,
    never framed by its boundary (sending it again cannot help), or cut short."""
    if not seen:
        raise EmptyUploadError(
            "the request body is empty: send one DICOM file per part of a multipart body"
        )
    if not framed:
        raise InvalidRequestError(
            f"the body holds no delimiter of the boundary its Content-Type declares "
            f"({quoted(closing[2:-2].decode('latin-1'))}): it is framed with another "
            "boundary, or it is not multipart"
        )
    raise UploadIncompleteError(
        "the multipart body ends without its closing boundary: the upload was cut short; "
        "send it again"
    )


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    """The value of the request header ``wanted`` (a lower-case name), or None."""
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return bytes(value)
    return None


def _closing_delimiter(scope: Scope) -> bytes | None:
    """``--boundary--`` of a multipart request, or None for other bodies; the boundary
    read as every other reader of the header reads it (:meth:`MediaType.parse`: quotes,
    the first of a repeated parameter)."""
    for name, value in scope.get("headers", ()):
        if name != b"content-type":
            continue
        media = MediaType.parse(bytes(value).decode("latin-1"))
        boundary = media.params.get("boundary")
        if media.type.startswith("multipart/") and boundary:
            return b"--" + boundary.encode("latin-1") + b"--"
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


# where patient data and results are answered: one rule, not a header per route (a
# route that forgot it let a browser or a shared proxy keep a report on disk)
NO_STORE_PREFIXES = ("/v1/", "/console/api/", "/dicomweb/")
HSTS = b"max-age=31536000"


class ResponsePolicyMiddleware:
    """``Cache-Control: no-store`` on the answers under :data:`NO_STORE_PREFIXES` (one
    that set its own keeps it), ``Strict-Transport-Security`` on every https answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        no_store = scope["path"].startswith(NO_STORE_PREFIXES)
        https = scope.get("scheme") == "https"
        if not no_store and not https:
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                if no_store and b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                if https and b"strict-transport-security" not in names:
                    headers.append((b"strict-transport-security", HSTS))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


__all__ = [
    "NO_STORE_PREFIXES",
    "BodyLimitMiddleware",
    "ControlCharactersMiddleware",
    "JsonErrorsMiddleware",
    "MetricsMiddleware",
    "ResponsePolicyMiddleware",
    "TimeoutMiddleware",
]
