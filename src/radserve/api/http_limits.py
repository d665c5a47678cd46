"""Bounds on the size and the arrival time of an HTTP request's head (request line and
header fields).

uvicorn's httptools protocol has neither. Size: a client sending one 20 MB header had it
buffered whole (68 MB of server memory) and answered 200. This protocol counts the bytes
of each request's head as they arrive and answers **431 Request Header Fields Too Large**
(and closes the connection) past :data:`MAX_REQUEST_HEAD`, before the parser buffers more.

Time: a client that opens a connection and sends its head a header line at a time (or
nothing at all: uvicorn's keep-alive timer runs only *after* a response) held the
connection for as long as it liked (300 such "slowloris" connections were all still open
after 30 s; the process's file descriptors bound how many one client may hold). A head
that is not complete ``head_timeout_s`` after the connection opened, or after its first
byte on a kept-alive connection, is answered **408 Request Timeout** and the connection
closed. :func:`bounded_protocol` sets that time from ``server.request_timeout_s``, the
bound the body of a request already has between two of its chunks.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_REQUEST_HEAD = 64 * 1024  # nginx's default is 4 x 8 KiB; Apache's 8 KiB a line

_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"connection: close\r\n"
    b"content-length: %d\r\n\r\n%s"
)
_BODY = (
    b'{"error":{"code":"invalid_request","message":"the request line and headers exceed '
    b'%d bytes","retryable":false}}' % MAX_REQUEST_HEAD
)
_408 = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"content-type: application/json\r\n"
    b"connection: close\r\n"
    b"content-length: %d\r\n\r\n%s"
)
_SLOW = (
    b'{"error":{"code":"request_timeout","message":"the request line and headers did not '
    b'arrive within %d s (server.request_timeout_s)","retryable":true}}'
)


class _SlowHeadLog:
    """At most one warning line per ``every_s`` for heads cut for time, each with the
    number cut since the line before (the rest of a burst is counted in the next line):
    a client that opens thousands of slow connections would otherwise choose how many
    lines the server writes (300 connections: 300 identical lines in one second)."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._last = -math.inf
        self._cut = 0

    def count(self, logger: Any, timeout_s: float) -> None:
        self._cut += 1
        now = self.clock()
        if now - self._last >= self.every_s:
            logger.warning(
                "%d request head(s) not complete after %.0f s: 408", self._cut, timeout_s
            )
            self._last, self._cut = now, 0


_slow_heads = _SlowHeadLog()


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :data:`MAX_REQUEST_HEAD` on each request head and
    ``head_timeout_s`` for it to arrive."""

    head_timeout_s: float = 60.0  # server.request_timeout_s's default

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            _slow_heads.count(self.logger, self.head_timeout_s)
            body = _SLOW % self.head_timeout_s
            self.transport.write(_408 % (len(body), body))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            end = data.find(b"\r\n\r\n")  # the head may end inside this chunk
            self._head_bytes += len(data) if end < 0 else end
            if self._head_bytes > MAX_REQUEST_HEAD:
                self.logger.warning("request head over %d bytes: 431", MAX_REQUEST_HEAD)
                self.transport.write(_431 % (len(_BODY), _BODY))
                self.transport.close()
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._arm_head_timer()  # a kept-alive connection's next request
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        super().on_headers_complete()


def bounded_protocol(head_timeout_s: float) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http=`` with ``head_timeout_s`` (uvicorn builds
    one instance per connection from the class, so the time is a class attribute)."""
    return type(
        "BoundedHttpToolsProtocol",
        (BoundedHttpToolsProtocol,),
        {"head_timeout_s": float(head_timeout_s)},
    )


__all__ = ["MAX_REQUEST_HEAD", "BoundedHttpToolsProtocol", "bounded_protocol"]
