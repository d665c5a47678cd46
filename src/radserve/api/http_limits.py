"""Bounds on the size and the arrival time of an HTTP request's head (request line and
header fields) and on the arrival rate of its body; uvicorn's own answers as JSON.

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

Body rate: a body trickling in (one byte every 2 s) was read for as long as it came,
each byte resetting the idle bound. As Apache's ``mod_reqtimeout`` (``body=20,MinRate=500``)
does, a body gets ``request_timeout_s`` from the end of its head, plus one second for each
``server.min_body_rate_bytes_s`` bytes that arrive; past that it is answered **408** (if
nothing was answered yet) and the connection closed. Time in which the server, not the
client, is behind (uvicorn paused reading: the app has not taken what arrived) is not
counted. A fast upload banks time, so a real upload over a slow link that stalls for a
while is not cut by this rule (the idle bound between chunks still applies).

uvicorn answers a request its parser refuses (a bad request line, a path that is not
ASCII, a malformed header) with a text/plain 400; here it is the API's JSON error body.

Stop: SIGTERM gives the requests running :data:`STOP_GRACE_S` to end. A request whose
body is still arriving then (a slow upload, a STOW-RS) is cut off: answered **503**
``server_unavailable``, retryable, with ``Retry-After`` (the API's JSON error body), what
the client still sends read and dropped for :data:`STOP_LINGER_S` so the answer is not
reset away; the app sees the client gone and stores nothing of it. In an API reader
process (``stop_cuts_all``) every request still running is cut then (503 when nothing
was answered yet, else the connection closed): uvicorn cancelled them a moment later,
which answered a text/plain 500 and logged a traceback. One WARNING line per stop says
how many were cut. The serving process on its own lets a request whose body has arrived
run to its end, as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import weakref
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from radserve.api.errors import error_body
from radserve.config import ServerSettings

logger = logging.getLogger(__name__)

MAX_REQUEST_HEAD = 64 * 1024  # nginx's default is 4 x 8 KiB; Apache's 8 KiB a line
# SIGTERM: how long the requests running then get before they are cut off (an API
# reader's "at most 5 s for a console event stream", now for every server)
STOP_GRACE_S = 5.0
# a request cut off by the stop: what the client still sends is read and dropped this
# long after the 503, so the answer is not reset away (nginx's lingering close)
STOP_LINGER_S = 1.0
# Retry-After of a request cut off by the stop: a restart takes about this long
STOP_RETRY_AFTER_S = 10


def _answer(
    status: bytes,
    code: str,
    message: str,
    retryable: bool = False,
    retry_after: int | None = None,
) -> bytes:
    """A whole HTTP/1.1 error answer with the API's JSON error body, closing."""
    body = json.dumps(error_body(code, message, retryable)).encode()
    extra = b"" if retry_after is None else b"retry-after: %d\r\n" % retry_after
    return (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"%scontent-length: %d\r\n\r\n%s" % (status, extra, len(body), body)
    )


_STOPPED = _answer(
    b"503 Service Unavailable",
    "server_unavailable",
    "the server is stopping and did not take this request; send it again",
    retryable=True,
    retry_after=STOP_RETRY_AFTER_S,
)


_431 = _answer(
    b"431 Request Header Fields Too Large",
    "invalid_request",
    f"the request line and headers exceed {MAX_REQUEST_HEAD} bytes",
)


class _CutLog:
    """At most one warning line per ``every_s`` for requests cut for time, each with the
    number cut since the line before (the rest of a burst is counted in the next line):
    a client that opens thousands of slow connections would otherwise choose how many
    lines the server writes (300 connections: 300 identical lines in one second).
    ``what`` is the line after the count, with one ``%`` field for the bound or reason."""

    def __init__(
        self, what: str, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.what = what
        self.every_s = every_s
        self.clock = clock
        self._last = -math.inf
        self._cut = 0

    def count(self, logger: Any, bound: float | str) -> None:
        self._cut += 1
        now = self.clock()
        if now - self._last >= self.every_s:
            logger.warning("%d " + self.what, self._cut, bound)
            self._last, self._cut = now, 0


_slow_heads = _CutLog("request head(s) not complete after %.0f s: 408")
_slow_bodies = _CutLog("request body(ies) slower than %d bytes/s: 408")
_big_heads = _CutLog("request head(s) over %d bytes: 431")
_refused = _CutLog("request(s) the HTTP parser refused (last: %s): 400")
_upgrades = _CutLog("request(s) asking to upgrade the protocol (%s): answered as HTTP/1.1")


class _StopCuts:
    """The connections of one server that were running a request when its stop began:
    those still running it :data:`STOP_GRACE_S` later are cut off together, with one
    log line for them all."""

    def __init__(self, loop: asyncio.AbstractEventLoop, grace_s: float) -> None:
        self.connections: list[BoundedHttpToolsProtocol] = []
        self.grace_s = grace_s
        loop.call_later(grace_s, self._cut)

    def _cut(self) -> None:
        answered = closed = 0
        for connection in self.connections:
            outcome = connection.stop_cut()
            answered += outcome == "answered"
            closed += outcome == "closed"
        if answered or closed:
            logger.warning(
                "stopping: %d request(s) still running %.0f s after the stop began were "
                "cut off (%d answered 503 server_unavailable, retryable, Retry-After %d "
                "s; %d closed mid-answer)",
                answered + closed,
                self.grace_s,
                answered,
                STOP_RETRY_AFTER_S,
                closed,
            )


# one per server (uvicorn's ServerState, shared by its connections), while it stops
_stops: weakref.WeakKeyDictionary[Any, _StopCuts] = weakref.WeakKeyDictionary()


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :data:`MAX_REQUEST_HEAD` on each request head,
    ``head_timeout_s`` for it to arrive, ``min_body_rate`` (bytes/s) for its body after a
    head start of ``head_timeout_s``, and JSON for the parser's 400."""

    head_timeout_s: float = 60.0  # server.request_timeout_s's default
    min_body_rate: float = 1024.0  # server.min_body_rate_bytes_s's default
    stop_grace_s: float = STOP_GRACE_S
    # at the stop's grace end, cut every request still running, not only those whose
    # body is still arriving (an API reader: see the module docstring)
    stop_cuts_all: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lingering = False  # cut off by the stop: what arrives is dropped
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_body = False
        self._body_deadline = 0.0  # loop time; moved on by each body byte
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._in_body = False
        self._disarm_body_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _disarm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            _slow_heads.count(self.logger, self.head_timeout_s)
            self._cut(
                _answer(
                    b"408 Request Timeout",
                    "request_timeout",
                    f"the request line and headers did not arrive within "
                    f"{self.head_timeout_s:.0f} s (server.request_timeout_s)",
                    retryable=True,
                )
            )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused:  # the app has not taken what came: the server is behind
            self._body_deadline = max(self._body_deadline, now + self.head_timeout_s)
        if now < self._body_deadline:
            self._body_timer = self.loop.call_at(self._body_deadline, self._body_timed_out)
            return
        _slow_bodies.count(self.logger, self.min_body_rate)
        self._in_body = False
        answered = self.cycle is not None and self.cycle.response_started
        self._cut(
            b""
            if answered
            else _answer(
                b"408 Request Timeout",
                "request_timeout",
                f"the request body arrived slower than {self.min_body_rate:.0f} bytes/s "
                "(server.min_body_rate_bytes_s); the request was dropped",
                retryable=True,
            )
        )

    def _cut(self, answer: bytes) -> None:
        """Send ``answer`` (if any) and close; the app's request, if one runs, sees the
        client gone (its later answer is dropped, as for a client that went away)."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if answer:
            self.transport.write(answer)
        self.transport.close()

    def shutdown(self) -> None:
        """uvicorn's graceful stop: a connection running a request is cut off if the
        request still runs :attr:`stop_grace_s` from now (:meth:`stop_cut`)."""
        super().shutdown()
        if (
            self.cycle is not None
            and not self.cycle.response_complete
            and not self.transport.is_closing()
        ):
            stop = _stops.get(self.server_state)
            if stop is None:
                stop = _stops[self.server_state] = _StopCuts(self.loop, self.stop_grace_s)
            stop.connections.append(self)

    def stop_cut(self) -> str | None:
        """The stop's grace has ended: cut this connection's request off if it still
        runs and its body is still arriving (or :attr:`stop_cuts_all`). "answered": a
        503 went out; "closed": the answer had started, the connection is closed;
        None: left alone."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or self.transport.is_closing():
            return None
        if not (self._in_body or self.stop_cuts_all):
            return None
        self._in_body = False
        self._disarm_body_timer()
        # the app's request sees the client gone: an upload stores nothing, its answer
        # (if any) is dropped
        cycle.disconnected = True
        cycle.message_event.set()
        if cycle.response_started:
            self.transport.abort()
            return "closed"
        self._lingering = True
        self.transport.write(_STOPPED)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(STOP_LINGER_S, self._end_linger)
        return "answered"

    def _end_linger(self) -> None:
        if self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size():  # the client reads nothing
            self.transport.abort()
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request its parser refuses, with the JSON error body."""
        self.transport.write(_answer(b"400 Bad Request", "invalid_request", msg))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # answered 503 by the stop: the rest of the body is dropped
            return
        if self._in_head:
            end = data.find(b"\r\n\r\n")  # the head may end inside this chunk
            self._head_bytes += len(data) if end < 0 else end
            if self._head_bytes > MAX_REQUEST_HEAD:
                _big_heads.count(self.logger, MAX_REQUEST_HEAD)
                self.transport.write(_431)
                self.transport.close()
                return
        # uvicorn's own data_received, its lines per refused request counted instead (a
        # client chose how many the server wrote; with ws="none" every Upgrade header
        # logged two, one telling to install a WebSocket library)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                _upgrades.count(self.logger, (self._get_upgrade() or b"?").decode("latin-1"))
        except httptools.HttpParserError as exc:
            _refused.count(self.logger, str(exc) or type(exc).__name__)
            self.send_400_response(f"the request is not valid HTTP/1.1: {exc}")
            return
        # armed here, not per request: a request without a body has ended by now
        if self._in_body and self._body_timer is None and not self.transport.is_closing():
            self._body_timer = self.loop.call_at(self._body_deadline, self._body_timed_out)

    def on_message_begin(self) -> None:
        # the head's byte count is not reset here: the parser begins a message while it
        # is fed the head's first piece, already counted by data_received (reset here, a
        # 100 KiB head that came in two pieces was bounded by its second alone: a 200)
        self._in_head = True
        self._arm_head_timer()  # a kept-alive connection's next request
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        # a WebSocket upgrade's bytes after the head are the other protocol's
        self._in_body = not (self.parser.should_upgrade() and self._should_upgrade())
        self._body_deadline = self.loop.time() + self.head_timeout_s
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_deadline += len(body) / self.min_body_rate
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm_body_timer()
        # what comes next on a kept-alive connection is the next request's head: counted
        # from its first byte (before the parser begins that message)
        self._in_head, self._head_bytes = True, 0
        super().on_message_complete()


def bounded_protocol(
    server: ServerSettings, *, stop_cuts_all: bool = False
) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http=`` with ``server``'s bounds (uvicorn builds
    one instance per connection from the class, so they are class attributes);
    ``stop_cuts_all``: an API reader's (see the module docstring)."""
    return type(
        "BoundedHttpToolsProtocol",
        (BoundedHttpToolsProtocol,),
        {
            "head_timeout_s": float(server.request_timeout_s),
            "min_body_rate": float(server.min_body_rate_bytes_s),
            "stop_cuts_all": stop_cuts_all,
        },
    )


def uvicorn_protocols(server: ServerSettings, *, stop_cuts_all: bool = False) -> dict[str, Any]:
    """uvicorn's ``http=`` and ``ws=`` for every radserve server (the serving process,
    the API readers, the tests' servers): the bounded protocol, and no WebSocket (the API
    has no WebSocket route; with one enabled, a request with ``Upgrade: websocket`` was
    answered by the WebSocket layer, a 403 with an empty body instead of the API's
    answer). ``stop_cuts_all``: an API reader's (see the module docstring)."""
    return {"http": bounded_protocol(server, stop_cuts_all=stop_cuts_all), "ws": "none"}


def forwarded_trust(server: ServerSettings) -> dict[str, Any]:
    """uvicorn's options for a socket clients reach: ``X-Forwarded-For``/``-Proto``
    believed from ``server.trusted_proxies`` only. uvicorn's own default believed them
    from 127.0.0.1 (or whatever ``FORWARDED_ALLOW_IPS`` said), so any local process could
    set the client address radserve audits; with no proxy trusted the middleware is off."""
    trusted = [str(network) for network in server.trusted_proxies]
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted}


__all__ = [
    "MAX_REQUEST_HEAD",
    "STOP_GRACE_S",
    "STOP_LINGER_S",
    "STOP_RETRY_AFTER_S",
    "BoundedHttpToolsProtocol",
    "bounded_protocol",
    "forwarded_trust",
    "uvicorn_protocols",
]
