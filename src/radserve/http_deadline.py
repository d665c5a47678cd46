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
``ALL_PROXY``, minus ``NO_PROXY``) is used as httpx and curl use it, with the same
total deadline: the connection to the proxy and the tunnel through it are the
attempt's too (docs/operations.md, "Outbound HTTP through a proxy").
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
from httpx._utils import get_environment_proxies  # httpx's own reading of *_PROXY

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


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's transport with its connection pool on :class:`_DeadlineBackend`, direct or
    through ``proxy``. httpx takes no network backend, so the pool it built is replaced
    by the same one (its defaults: system CAs and the SSL_CERT_* environment, httpx's
    default limits) on ours: through a proxy too, every connection (to the proxy, the
    CONNECT tunnel and the TLS inside it) waits at most the attempt's time left."""

    def __init__(self, proxy: httpx.Proxy | None = None) -> None:
        super().__init__()
        self._pool = _pool(httpx.create_ssl_context(), proxy)


def _pool(ssl_context: ssl.SSLContext, proxy: httpx.Proxy | None) -> httpcore.ConnectionPool:
    """httpx's own pool for ``proxy`` (as :class:`httpx.HTTPTransport` builds it), on
    :class:`_DeadlineBackend`."""
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
    if proxy.url.scheme in ("http", "https"):
        return httpcore.HTTPProxy(
            proxy_url=url,
            proxy_auth=proxy.raw_auth,
            proxy_headers=proxy.headers.raw,
            proxy_ssl_context=proxy.ssl_context,
            **common,
        )
    if proxy.url.scheme in ("socks5", "socks5h"):  # needs httpx[socks], as httpx's own
        return httpcore.SOCKSProxy(proxy_url=url, proxy_auth=proxy.raw_auth, **common)
    raise ValueError(
        f"a proxy from the environment has the scheme {proxy.url.scheme!r}; "
        "http, https, socks5 and socks5h are supported"
    )


def _environment_mounts() -> dict[str, httpx.BaseTransport | None]:
    """The proxies of the server's environment (``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``, ``NO_PROXY``, read as httpx and curl read them), each on a
    :class:`_DeadlineTransport`. httpx reads them only for a client with its default
    transport: given ours, it ignored them, and every sender went around the site's proxy."""
    return {
        pattern: None if url is None else _DeadlineTransport(httpx.Proxy(url))
        for pattern, url in get_environment_proxies().items()
    }


def deadline_client(*, timeout_s: float | None = None) -> httpx.Client:
    """An httpx client (no redirects followed) whose attempts inside
    :func:`total_deadline` end in time, through the environment's proxy if it names one;
    ``timeout_s``: also each operation's own limit."""
    timeout = httpx.Timeout(timeout_s) if timeout_s is not None else httpx.Timeout(None)
    return httpx.Client(
        transport=_DeadlineTransport(),
        mounts=_environment_mounts(),
        timeout=timeout,
        follow_redirects=False,
    )


__all__ = ["deadline_client", "total_deadline"]
