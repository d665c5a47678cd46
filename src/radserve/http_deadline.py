"""A total time for one HTTP attempt, from connect to the answer's last byte.

httpx's timeouts are per operation: each read may wait ``read`` seconds, so a receiver
that answers one byte every few seconds (a critical-finding webhook, a FHIR server, a
deadline-risk webhook) held an attempt -- and its outbox lane, the notice ``sending`` --
for as long as it kept dripping. Every sender here opens its client with
:func:`deadline_client` and makes each attempt inside :func:`total_deadline`: each
connect, TLS handshake, read and write of the attempt then waits at most the time left,
and none starts once it is spent (httpx's own ``TimeoutException`` types, so the
senders' handling of a timeout is unchanged).

A proxy named by the server's environment (``HTTPS_PROXY``, ``HTTP_PROXY``,
``ALL_PROXY``, minus ``NO_PROXY``: :mod:`radserve.http_proxies`) is used as curl uses
it, with the same total deadline: the connection to the proxy and the tunnel through it
are the attempt's too (docs/operations.md, "Outbound HTTP through a proxy"). Only httpx's
and httpcore's public API is used (httpx's private reading of the variables was, until
2026-12-07).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import httpcore
import httpx

from radserve.http_proxies import EnvironmentProxies

# the monotonic time the current attempt must end by (None: no total limit)
_ENDS_AT: ContextVar[float | None] = ContextVar("radserve_http_deadline", default=None)
_WRITE_CHUNK = 64 * 1024  # a long body is written a chunk at a time, each within the time left


@contextmanager
def total_deadline(seconds: float) -> Iterator[None]:
    """Every network operation of the HTTP requests made inside ends within ``seconds``
    of entering, all together (their connections opened by :func:`deadline_client`)."""
    token = _ENDS_AT.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _ENDS_AT.reset(token)


def _time_left(timeout: float | None, expired: type[httpcore.TimeoutException]) -> float | None:
    """``timeout`` cut to the time the attempt has left; ``expired`` once none is left."""
    ends_at = _ENDS_AT.get()
    if ends_at is None:
        return timeout
    left = ends_at - time.monotonic()
    if left <= 0:
        raise expired("the attempt's total time is spent")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation waits at most the attempt's time left."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), _WRITE_CHUNK):
            chunk = buffer[start : start + _WRITE_CHUNK]
            self._stream.write(chunk, _time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _time_left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own sockets, each wrapped in a :class:`_DeadlineStream`."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = _time_left(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, left, local_address, socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        left = _time_left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


# httpcore's errors as the httpx ones the senders catch (what httpx's own transport
# raises), the most specific first
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for raised, mapped in _ERRORS:
            if isinstance(exc, raised):
                raise mapped(str(exc)) from exc
        raise


class _ResponseStream(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx_errors():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class _DeadlineTransport(httpx.BaseTransport):
    """An httpx transport on an httpcore pool over :class:`_DeadlineBackend`, direct or
    through ``proxy``: through a proxy too, every connection (to the proxy, the CONNECT
    tunnel and the TLS inside it) waits at most the attempt's time left. Built from
    httpx's and httpcore's public API only (what :class:`httpx.HTTPTransport` does with
    its defaults: system CAs and the SSL_CERT_* environment, httpx's default limits):
    httpx takes no network backend of its own."""

    def __init__(self, proxy: httpx.Proxy | None = None) -> None:
        self._pool = _pool(httpx.create_ssl_context(), proxy)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        outgoing = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors():
            answer = self._pool.handle_request(outgoing)
        assert isinstance(answer.stream, Iterable)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_ResponseStream(answer.stream),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def _pool(ssl_context: ssl.SSLContext, proxy: httpx.Proxy | None) -> httpcore.ConnectionPool:
    """httpcore's pool for ``proxy`` (an http:// or https:// one), as
    :class:`httpx.HTTPTransport` builds it, on :class:`_DeadlineBackend`."""
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)
    common: dict[str, Any] = {
        "ssl_context": ssl_context,
        "max_connections": limits.max_connections,
        "max_keepalive_connections": limits.max_keepalive_connections,
        "keepalive_expiry": limits.keepalive_expiry,
        "network_backend": _DeadlineBackend(),
    }
    if proxy is None:
        return httpcore.ConnectionPool(**common)
    url = httpcore.URL(
        scheme=proxy.url.raw_scheme,
        host=proxy.url.raw_host,
        port=proxy.url.port,
        target=proxy.url.raw_path,
    )
    return httpcore.HTTPProxy(
        proxy_url=url,
        proxy_auth=proxy.raw_auth,
        proxy_headers=proxy.headers.raw,
        proxy_ssl_context=proxy.ssl_context,
        **common,
    )


class _ProxyRouting(httpx.BaseTransport):
    """Each request direct or through the proxy the environment names for its URL
    (:class:`radserve.http_proxies.EnvironmentProxies`, read when the client is made, as
    httpx reads it), each way on a :class:`_DeadlineTransport`. A URL whose proxy
    radserve cannot use (a SOCKS one) fails with :class:`httpx.ProxyError` saying why;
    ``radserve serve`` refuses to start before that (:func:`http_proxies.proxy_problems`)."""

    def __init__(self, proxies: EnvironmentProxies) -> None:
        self._proxies = proxies
        self._direct = _DeadlineTransport()
        self._through = {
            proxy: _DeadlineTransport(httpx.Proxy(proxy)) for proxy in proxies.usable()
        }

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        proxy = self._proxies.proxy_for(request.url)
        if proxy is None:
            return self._direct.handle_request(request)
        transport = self._through.get(proxy)
        if transport is None:
            problem = self._proxies.problem(request.url) or f"unusable proxy for {request.url}"
            raise httpx.ProxyError(problem, request=request)
        return transport.handle_request(request)

    def close(self) -> None:
        self._direct.close()
        for transport in self._through.values():
            transport.close()


def deadline_client(*, timeout_s: float | None = None) -> httpx.Client:
    """An httpx client (no redirects followed) whose attempts inside
    :func:`total_deadline` end in time, through the environment's proxy if it names one;
    ``timeout_s``: also each operation's own limit."""
    timeout = httpx.Timeout(timeout_s) if timeout_s is not None else httpx.Timeout(None)
    return httpx.Client(
        transport=_ProxyRouting(EnvironmentProxies.read()),
        timeout=timeout,
        follow_redirects=False,
    )


__all__ = ["deadline_client", "total_deadline"]
