"""A TLS handshake that a plain port ends with a clean close (``SSLZeroReturnError``, "TLS/SSL
connection has been closed (EOF)") says the port does not answer in TLS, as the abrupt close
(``UNEXPECTED_EOF_WHILE_READING``) does: which of the two a client meets depends on when the
port's close lands (a fresh clone's loaded test run met the clean one)."""

from __future__ import annotations

import ssl

import pytest

from radserve.gateway.config import Destination
from radserve.gateway.scu import _tls_failure

PACS = Destination(name="pacs", ae_title="PACS", host="127.0.0.1", port=11112)


@pytest.mark.parametrize(
    "exc",
    [
        ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed (EOF) (_ssl.c:992)"),
        ssl.SSLEOFError(8, "EOF occurred in violation of protocol (_ssl.c:992)"),
    ],
)
def test_a_closed_handshake_names_a_port_without_tls(exc: ssl.SSLError) -> None:
    # as _ssl sets them: no reason on the clean close, OpenSSL 3's on the abrupt one
    exc.reason = "UNEXPECTED_EOF_WHILE_READING" if isinstance(exc, ssl.SSLEOFError) else None
    said = _tls_failure(PACS, exc, 2.0)
    assert "the destination's port does not answer in TLS" in said, said
