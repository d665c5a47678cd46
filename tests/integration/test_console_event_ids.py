"""The worklist's event stream with a ``Last-Event-ID`` that is no number of its feed,
as a broken proxy or any HTTP client may send it: the stream starts afresh (as without
the header), never a 500. Before: digits Python's ``str.isdigit`` accepts but ``int``
does not ("²", read from the header's latin-1 byte 0xB2) and a number of 5,000 digits
(beyond ``int``'s limit) were 500s. Real app over HTTP, a signed-in session."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from tests.factories.service import live_server, settings_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("last", [b"\xb2", b"1\xb9", b"9" * 5000, b"-1", b"1.5"])
def test_an_odd_last_event_id_starts_the_stream_afresh(tmp_path: Path, last: bytes) -> None:
    settings = settings_for(tmp_path)
    with (
        live_server(settings, roles=("read",), console=True, warm=False) as srv,
        httpx.Client(base_url=srv["url"], timeout=30) as browser,
    ):
        assert browser.post("/console/api/session", json={"key": srv["read"]}).status_code == 200
        headers = [(b"Last-Event-ID", last)]
        with browser.stream("GET", "/console/api/events", headers=headers) as r:
            assert r.status_code == 200, r.read()
            seen = b""
            for chunk in r.iter_bytes():
                seen += chunk
                if b"event: hello" in seen:
                    break
        assert seen.startswith(b"retry: 500\n\n"), seen
        assert b"event: hello" in seen  # a fresh start, as without the header
