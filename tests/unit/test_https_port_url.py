"""The ``https://`` address a plain-HTTP request on the HTTPS port is told to use: the
one the client named (its Host header) when that is a well-formed host, else the
address the server is bound to; nothing else the client sent is echoed."""

from __future__ import annotations

import json

import pytest

from radserve.api.https_port import https_url, plain_http_answer

BOUND = ("10.0.0.5", 8443)


def _request(*headers: str) -> bytes:
    return ("GET /v1/jobs HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


@pytest.mark.parametrize(
    ("peeked", "sockname", "url"),
    [
        (
            _request("Host: radserve.hospital.local:8443"),
            BOUND,
            "https://radserve.hospital.local:8443/",
        ),
        (_request("user-agent: curl", "HOST:ai_node.lan"), BOUND, "https://ai_node.lan/"),
        (_request("Host: [fd00::5]:8443"), BOUND, "https://[fd00::5]:8443/"),
        (_request(), BOUND, "https://10.0.0.5:8443/"),  # HTTP/1.0 without Host
        (_request("Host: <script>alert(1)</script>"), BOUND, "https://10.0.0.5:8443/"),
        (_request("Host: a b"), BOUND, "https://10.0.0.5:8443/"),
        (b"GET / HTTP/1.1\r\nHost: cut-sho", BOUND, "https://10.0.0.5:8443/"),  # head cut
        (_request(), ("::1", 8443, 0, 0), "https://[::1]:8443/"),
        (b"\x00\x01garbage", BOUND, "https://10.0.0.5:8443/"),
    ],
)
def test_the_address_to_use(peeked: bytes, sockname: tuple[object, ...], url: str) -> None:
    assert https_url(peeked, sockname) == url


def test_the_answer_is_a_whole_closing_400_with_the_api_error_body() -> None:
    answer = plain_http_answer("https://10.0.0.5:8443/")
    head, body = answer.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 400 Bad Request"
    assert "connection: close" in lines and f"content-length: {len(body)}" in lines
    error = json.loads(body)["error"]
    assert error == {
        "code": "invalid_request",
        "message": "this port speaks HTTPS only: use https://10.0.0.5:8443/ (https://, not http://)",
        "retryable": False,
    }
