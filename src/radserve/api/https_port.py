"""Plain HTTP on the HTTPS port is answered, not dropped.

With uvicorn's own TLS (``ssl=`` on the listening socket) every byte a client sends goes
to the TLS layer first: a plain ``http://`` request failed the handshake, the connection
was closed with nothing sent, and nothing was logged (asyncio logs a failed handshake at
DEBUG, and only in its debug mode). curl said "Empty reply from server"; the IT engineer
who mistyped the scheme had nothing to go on, and neither had the server's log.

As nginx does (its 497, answered 400), uvicorn now listens on a plain socket and each
connection's first byte decides (a TLS client's first record is a handshake, 0x16; no
HTTP method starts with it):

- a TLS handshake: the connection gets a TLS transport from the event loop with
  radserve's own server context (the one uvicorn was given before, so the TLS floor and
  the client-certificate check are unchanged), and uvicorn's HTTP protocol is connected
  to it after the handshake, as uvicorn's ``ssl=`` did (the scope's scheme is
  ``https``; keep-alive and the bounds of :mod:`radserve.api.http_limits` as before);
- anything else: answered ``400`` in the clear, the API's JSON error body naming the
  ``https://`` address to use, and closed; one WARNING line (at most one per 10 s, with
  the count) names the peer's address and nothing the client sent;
- a close before the first byte (a TCP health check), or nothing for
  ``server.request_timeout_s``: closed without a word, as before;
- a TLS handshake refused (no or an untrusted client certificate, TLS under 1.2, a
  client that does not trust this server's certificate): one WARNING line (at most one
  per 10 s, with the count) with the peer's address and OpenSSL's reason; uvicorn's own
  TLS logged nothing, and the engineer setting up that client had nothing to go on.

The first byte is peeked (``MSG_PEEK``), not read, so the TLS layer reads the client's
hello from the socket itself: see :class:`HttpsPortProtocol`. uvicorn is used through its
public ``Config(http=<protocol class>)``; it builds that protocol per connection with
its own arguments, handed on unchanged to uvicorn's protocol. No WebSocket is lost:
radserve serves none (``ws="none"``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import ssl
from typing import Any, cast

from radserve.api.errors import error_body
from radserve.api.http_limits import _CutLog, uvicorn_protocols
from radserve.config import ServerSettings

logger = logging.getLogger(__name__)

TLS_HANDSHAKE_RECORD = 0x16  # RFC 8446 5.1: a TLS client's first record
LINGER_S = 2.0  # read and drop what the client still sends, so the 400 is not reset away
_PEEK_BYTES = 4096  # enough for a request line and a Host header
_HOST = re.compile(
    rb"host:[ \t]*([A-Za-z0-9._\-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?[ \t]*", re.IGNORECASE
)

PLAIN_HTTP_LINE = "plain-HTTP connection(s) to the HTTPS port (last from %s): 400"
REFUSED_TLS_LINE = "TLS handshake(s) refused on the HTTPS port (last: %s)"


def https_url(peeked: bytes, sockname: Any) -> str:
    """The ``https://`` address of this port as the client named it (its ``Host``
    header, when the peeked bytes hold a well-formed one), else as it is bound."""
    for line in peeked.split(b"\r\n")[1:-1]:  # whole lines only: the last may be cut
        if not line:
            break  # the end of the head
        found = _HOST.fullmatch(line)
        if found:
            return f"https://{found.group(1).decode()}{(found.group(2) or b'').decode()}/"
    host, port = str(sockname[0]), int(sockname[1])
    return f"https://[{host}]:{port}/" if ":" in host else f"https://{host}:{port}/"


def plain_http_answer(url: str) -> bytes:
    """The whole 400 for a plain-HTTP request: the API's JSON error body, closing."""
    message = f"this port speaks HTTPS only: use {url} (https://, not http://)"
    body = json.dumps(error_body("invalid_request", message)).encode()
    return (
        b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )


class _PlainAnswer(asyncio.Protocol):
    """A plain-HTTP connection on the HTTPS port: the 400 sent at once, then what the
    client still sends is read and dropped until it closes, for at most
    :data:`LINGER_S` (closed with unread bytes, the socket sends a reset, and the client
    may lose the answer before reading it: nginx's "lingering close")."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        transport.write(self.answer)
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        """Dropped: the request was answered from its first bytes."""


class HttpsPortProtocol(asyncio.Protocol):
    """uvicorn's ``http=`` class on an HTTPS port (see the module docstring): built by
    uvicorn per accepted connection with uvicorn's keyword arguments, which it hands on
    unchanged to :attr:`http_class`. The class attributes are set by
    :func:`https_port_protocol`.

    The accepted connection's transport is closed in :meth:`connection_made`, before it
    has read anything (uvloop starts reading after ``connection_made`` even if it paused
    the transport), the connection kept open by a duplicate of its descriptor; once the
    first byte is known, ``loop.connect_accepted_socket`` gives that socket a new
    transport, with TLS or without, as the loop's own ``create_server(ssl=...)`` does
    for each connection it accepts."""

    http_class: type[asyncio.Protocol]
    context: ssl.SSLContext
    timeout_s: float = 60.0  # for the first byte, then for the TLS handshake
    # one WARNING line per 10 s at most, with the count: a client must not choose how
    # many lines the server writes
    plain_log: _CutLog
    tls_log: _CutLog  # refused TLS handshakes, likewise

    def __init__(self, **uvicorn_kwargs: Any) -> None:
        self._uvicorn_kwargs = uvicorn_kwargs
        self._loop = asyncio.get_running_loop()
        # uvicorn's stop calls shutdown() on each: an undecided connection is closed
        self._connections: set[Any] = uvicorn_kwargs["server_state"].connections
        self._sock: socket.socket | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = transport.get_extra_info("socket")
        try:
            self._sock = socket.socket(fileno=os.dup(raw.fileno()))
        except OSError:
            transport.abort()
            return
        transport.abort()  # its descriptor only: the duplicate holds the connection
        self._sock.setblocking(False)
        self._connections.add(self)
        self._loop.add_reader(self._sock.fileno(), self._first_bytes)
        self._timer = self._loop.call_later(self.timeout_s, self.shutdown)

    def connection_lost(self, exc: Exception | None) -> None:
        """The first transport's, closed by :meth:`connection_made` on purpose."""

    def _first_bytes(self) -> None:
        sock = self._sock
        assert sock is not None
        try:
            peeked = sock.recv(_PEEK_BYTES, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            peeked = b""
        if not peeked:  # closed (or reset) before a byte: a health check
            self.shutdown()
            return
        self._forget()
        self._sock = None
        if peeked[0] == TLS_HANDSHAKE_RECORD:
            _keep(self._loop.create_task(self._serve_tls(sock)))
            return
        self.plain_log.count(logger, _peer_host(sock))
        try:
            answer = plain_http_answer(https_url(peeked, sock.getsockname()))
        except OSError:  # reset already
            sock.close()
            return
        plain = self._loop.connect_accepted_socket(lambda: _PlainAnswer(answer), sock=sock)
        _keep(self._loop.create_task(plain))

    async def _serve_tls(self, sock: socket.socket) -> None:
        """uvicorn's protocol on the TLS transport, connected after the handshake."""
        peer = _peer_host(sock)
        try:
            await self._loop.connect_accepted_socket(
                lambda: self.http_class(**self._uvicorn_kwargs),
                sock=sock,
                ssl=self.context,
                ssl_handshake_timeout=self.timeout_s,
            )
        except ssl.SSLEOFError:  # the client went away mid-handshake: nothing to say
            logger.debug("TLS handshake from %s ended by the client", peer)
        except ssl.SSLError as exc:
            # a refused client certificate, a TLS version under the floor, a client that
            # does not trust this server's certificate: the engineer setting up that
            # client needs OpenSSL's reason (uvicorn's TLS logged nothing); rate-limited
            # as the plain-HTTP line, only the address and the reason
            self.tls_log.count(logger, f"{peer}: {exc.reason or type(exc).__name__}")
        except OSError as exc:  # TimeoutError, ConnectionError: a slow or vanished client
            logger.debug("TLS handshake from %s failed: %s", peer, type(exc).__name__)

    def _forget(self) -> None:
        if self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._connections.discard(self)

    def shutdown(self) -> None:
        """uvicorn's graceful stop, or no first byte in time: closed without a word."""
        self._forget()
        if self._sock is not None:
            self._sock.close()
            self._sock = None


_tasks: set[asyncio.Task[Any]] = set()


def _keep(task: asyncio.Task[Any]) -> None:
    """A reference to ``task`` until it ends (the loop keeps only a weak one)."""
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


def _peer_host(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername()[0])
    except OSError:  # reset already
        return "?"


def https_port_protocol(
    http_class: type[asyncio.Protocol], context: ssl.SSLContext, timeout_s: float
) -> type[HttpsPortProtocol]:
    """The protocol class for uvicorn's ``http=`` on an HTTPS port: ``http_class``
    (:func:`radserve.api.http_limits.bounded_protocol`) behind TLS from ``context``,
    plain HTTP answered 400; uvicorn itself is then given no ``ssl``."""
    return type(
        "HttpsPortProtocol",
        (HttpsPortProtocol,),
        {
            "http_class": http_class,
            "context": context,
            "timeout_s": timeout_s,
            "plain_log": _CutLog(PLAIN_HTTP_LINE),
            "tls_log": _CutLog(REFUSED_TLS_LINE),
        },
    )


def public_protocols(
    server: ServerSettings, https: ssl.SSLContext | None, *, stop_cuts_all: bool = False
) -> dict[str, Any]:
    """uvicorn's ``http=`` and ``ws=`` for the socket clients reach:
    :func:`~radserve.api.http_limits.uvicorn_protocols` (``stop_cuts_all``: an API
    reader's), behind :class:`HttpsPortProtocol` when ``https`` is set (then give uvicorn
    no ``ssl``)."""
    protocols = uvicorn_protocols(server, stop_cuts_all=stop_cuts_all)
    if https is not None:
        timeout_s = float(server.request_timeout_s)
        protocols["http"] = https_port_protocol(protocols["http"], https, timeout_s)
    return protocols


__all__ = [
    "HttpsPortProtocol",
    "https_port_protocol",
    "https_url",
    "plain_http_answer",
    "public_protocols",
]
