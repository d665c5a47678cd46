"""Forwarding to the serving process: what an API reader process does not answer itself.

The serving process listens on a Unix socket only the readers reach; a reader passes
each other request on (httpx over that socket), streaming the body both ways, with
``X-Forwarded-For`` / ``X-Forwarded-Proto`` set from its own connection, or from what a
proxy in ``server.trusted_proxies`` told it (the serving process trusts them on that
socket only), so the audit records the real client. Whatever ``X-Forwarded-*`` or
``Forwarded`` header the client sent is dropped, never passed on or appended to: the
serving process believes these headers, the client must not be able to set them. Body
limits, timeouts, error bodies and metrics of forwarded requests are the serving
process's own. When it cannot be reached the client gets a retryable 503.

The forwarding client keeps no cookies (each client's own ``Cookie`` header goes through
as it came): a console session cookie kept by a shared client went out with every later
client's requests, signing them in as the first user. A client that goes away ends its
forwarded request wherever it is, sending the body, waiting for the answer or relaying
it (the console's event stream would otherwise run on upstream); so does one that the
server's stop cut off (:mod:`radserve.api.http_limits`, which answered it 503): before,
the reader waited on for the serving process until uvicorn cancelled the request, which
answered a text/plain 500 and logged a traceback.

A pooled connection the serving process closed (it closes one after an unexpected
error's 500, or when its keep-alive time runs out) can be taken for the next request
before the close is seen: that request then fails before any byte of an answer. It was
never read there, so it is sent again once, on a new connection (any method: its body,
when one was sent, is replayed from what was kept of it; one larger than
``_REPLAY_BYTES`` that had started to go out is not, and gets the 503).
"""

from __future__ import annotations

import http.cookiejar
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from starlette.types import Receive, Scope, Send

from radserve.api.errors import error_response
from radserve.api.http_limits import STOP_RETRY_AFTER_S
from radserve.errors import RadserveError

logger = logging.getLogger(__name__)

# per connection, never forwarded (RFC 9110 7.6.1)
_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
}


# the serving process's own response headers the reader's server sets again: passed on,
# every answer carried two Date headers
_SET_BY_READER = {b"date", b"server"}
# how much of a request body is kept to send it again on a new connection (sign-in,
# JSON actions; an upload's first part)
_REPLAY_BYTES = 256 * 1024
# a request that failed thus before any answer arrived was not taken by the serving
# process (a closed pooled connection); ConnectError is not among them: no server
_NOT_TAKEN = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _passed_on(name: bytes) -> bool:
    """A request header the reader forwards: not per connection, and no client's claim
    about who sent the request (the reader sets ``X-Forwarded-*`` itself)."""
    return name not in _HOP and name != b"forwarded" and not name.startswith(b"x-forwarded-")


class ServingUnavailableError(RadserveError):
    """The serving process did not take a forwarded request (starting or stopping)."""

    code = "server_unavailable"
    retryable = True
    retry_after = STOP_RETRY_AFTER_S


class _NoCookies(http.cookiejar.CookieJar):
    """A cookie jar that never keeps one: a proxy shared by every client must not."""

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:
        return None

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None


class Upstream:
    """An ASGI app that forwards HTTP requests to the serving process's socket."""

    def __init__(self, socket_path: str) -> None:
        self.client = self._client(socket_path, keep_alive=64)
        # a second try goes out on a connection of its own (never a pooled one that may
        # be closed too)
        self.fresh = self._client(socket_path, keep_alive=0)

    @staticmethod
    def _client(socket_path: str, *, keep_alive: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=socket_path),
            base_url="http://radserve",
            timeout=httpx.Timeout(None),  # the serving process applies its own time-outs
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=keep_alive),
            cookies=_NoCookies(),  # httpx copies a Cookies object into a new jar
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no websockets in the API
            return
        headers = [(k, v) for k, v in scope["headers"] if _passed_on(k)]
        client = scope.get("client")
        headers.append((b"x-forwarded-for", (client[0] if client else "unknown").encode()))
        headers.append((b"x-forwarded-proto", scope.get("scheme", "http").encode()))
        query = scope.get("query_string", b"")
        target = scope["raw_path"] if scope.get("raw_path") else scope["path"].encode()
        url = (target + (b"?" + query if query else b"")).decode("latin-1")
        watch = _ClientWatch(receive)
        body = _Body(receive, watch) if _has_body(scope) else None
        if body is None:
            watch.free.set()
        # a client that goes away (or that the server's stop cut off: http_limits) ends
        # the forwarded request wherever it is: sending the body, waiting for the answer
        # (it waited on, for uvicorn's cancel at the stop: a text/plain 500 and a
        # traceback), or relaying the answer
        async with anyio.create_task_group() as group:
            group.start_soon(watch.run, group.cancel_scope)
            await self._forward(scope, url, headers, body, watch, receive, send)
            group.cancel_scope.cancel()

    async def _forward(
        self,
        scope: Scope,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: _Body | None,
        watch: _ClientWatch,
        receive: Receive,
        send: Send,
    ) -> None:
        method = scope["method"]
        try:
            try:
                response = await self._send(self.client, method, url, headers, body)
            except _NOT_TAKEN as exc:
                if body is not None and not body.replayable:
                    raise
                logger.info(
                    "serving process closed a pooled connection (%s); sending the request "
                    "again on a new one",
                    type(exc).__name__,
                )
                response = await self._send(self.fresh, method, url, headers, body)
        except httpx.TransportError as exc:
            if body is not None and body.gone:  # the client went away: no one to answer
                logger.debug("forwarded request ended: the client closed the connection")
                return
            logger.warning("serving process unreachable: %s", type(exc).__name__)
            message = "the server is starting or stopping; try again"
            await error_response(ServingUnavailableError(message))(scope, receive, send)
            return
        watch.free.set()  # answered before it read the whole body: receive() is free now
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k, v)
                        for k, v in response.headers.raw
                        if k.lower() not in _HOP and k.lower() not in _SET_BY_READER
                    ],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()

    @staticmethod
    async def _send(
        client: httpx.AsyncClient,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: _Body | None,
    ) -> httpx.Response:
        request = client.build_request(
            method, url, headers=headers, content=body.chunks() if body is not None else None
        )
        return await client.send(request, stream=True)

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.fresh.aclose()


def _has_body(scope: Scope) -> bool:
    return any(k in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"])


class _ClientWatch:
    """Waits for the client to go away (``http.disconnect``), then cancels the forwarded
    request; it calls ``receive()`` only once ``free`` is set (the body was read to its
    end, or the answer came), so it never takes a piece of the body."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.free = anyio.Event()

    async def run(self, scope: anyio.CancelScope) -> None:
        await self.free.wait()
        while (await self._receive())["type"] != "http.disconnect":
            pass
        scope.cancel()


class _Body:
    """The client's request body, streamed on; its first ``_REPLAY_BYTES`` are kept, so
    a request whose connection turned out closed can be sent again from its start."""

    def __init__(self, receive: Receive, watch: _ClientWatch) -> None:
        self._receive = receive
        self._watch = watch
        self._kept: list[bytes] = []
        self._size = 0
        self._complete = False
        self._gone = False  # the client went away: nothing to send again
        self._overflow = False  # more was read than was kept

    @property
    def replayable(self) -> bool:
        return not self._gone and not self._overflow

    @property
    def gone(self) -> bool:
        """The client went away before its body was read to its end."""
        return self._gone

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in list(self._kept):
            yield chunk
        while not self._complete:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._gone = True
                raise httpx.ReadError("the client closed the connection")
            chunk = message.get("body", b"")
            self._complete = not message.get("more_body", False)
            if self._complete:  # no more receive() here: the watch may call it
                self._watch.free.set()
            if not chunk:
                continue
            self._size += len(chunk)
            if self._size <= _REPLAY_BYTES and not self._overflow:
                self._kept.append(chunk)
            else:
                self._overflow = True
                self._kept.clear()
            yield chunk


__all__ = ["ServingUnavailableError", "Upstream"]
