"""A bound on the size of an HTTP request's head (request line and header fields).

uvicorn's httptools protocol has none: a client sending one 20 MB header had it buffered
whole (68 MB of server memory) and answered 200. This protocol counts the bytes of each
request's head as they arrive and answers **431 Request Header Fields Too Large** (and
closes the connection) past :data:`MAX_REQUEST_HEAD`, before the parser buffers more.
"""

from __future__ import annotations

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


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :data:`MAX_REQUEST_HEAD` on each request head."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0

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
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()


__all__ = ["MAX_REQUEST_HEAD", "BoundedHttpToolsProtocol"]
