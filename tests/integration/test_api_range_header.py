"""The Range header on every file download (label maps, key images, the analysed volume,
the console's result downloads, its page and its assets), against a running server:
RFC 9110 14.2 says a Range header with an unknown unit or an invalid range set is
ignored (200, the whole file); a valid one is served (206); 416 only for a valid range
set none of whose ranges is satisfiable. ``bytes=--1`` was answered 416 (Starlette read
it as "the last -1 bytes"), ``bytes=+1-2`` and ``bytes=1_0-20`` were served as ranges
(Python's ``int()`` took them), and the console's assets answered ``bytes=abc`` with a
text/plain 400."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from tests.factories.service import auth, live_server, make_study, settings_for, upload, wait_job

pytestmark = pytest.mark.slow

# RFC 9110: not a valid bytes ranges-specifier, or another unit: the whole file, 200
IGNORED = (
    "bytes=--1",
    "bytes=abc",
    "bytes=5-2",
    "items=0-1",
    "bytes=",
    "bytes=-",
    "bytes=1-2-3",
    "bytes=+1-2",
    "bytes=0x1-2",
    "bytes=1_0-20",
    "bytes=\uff11-2".encode(),  # a fullwidth digit one (UTF-8: the server reads latin-1)
    "bytes =0-1",
    "bytes=0-1,abc",
    "=0-1",
    "bytes",
    "bytes=1--2",
    "bytes=-+1",
)
# valid and satisfiable: (header, the bytes served as [start, end) of the file)
SERVED = (
    ("bytes=0-9", (0, 10)),
    ("Bytes=0-9", (0, 10)),
    ("bytes=2-", (2, None)),
    ("bytes=-10", (-10, None)),
    ("bytes=0-4, 5-9", (0, 10)),  # adjacent ranges are merged
    ("bytes=3-3", (3, 4)),
    ("bytes=0-99999999999999999999999", (0, None)),
    ("bytes=,0-9,", (0, 10)),  # empty list elements are allowed (RFC 9110 5.6.1)
)


def unsatisfiable(size: int) -> tuple[str, ...]:
    return (f"bytes={size}-", f"bytes={size + 10}-{size + 20}", "bytes=-0", f"bytes={'9' * 30}-")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("ranges")
    with live_server(settings_for(root), roles=("submit", "read"), console=True) as live:
        c = live["client"]
        r = c.post(
            "/v1/studies", files=upload(make_study(root / "s")), headers=auth(live["submit"])
        )
        assert r.status_code == 202, r.text
        assert wait_job(c, r.json()["id"], live["submit"])["state"] == "succeeded"
        page = c.get("/")
        asset = re.search(r'src="(/console/assets/[^"]+\.js)"', page.text)
        assert asset is not None, page.text
        job = r.json()["id"]
        yield {
            **live,
            "paths": (
                f"/v1/jobs/{job}/labels",
                f"/v1/jobs/{job}/images/1",
                f"/v1/jobs/{job}/volume",
                f"/console/api/jobs/{job}/files/report.json",
                "/",
                asset[1],
            ),
        }


@pytest.mark.parametrize("index", range(6))
def test_every_download_ignores_an_invalid_range_and_refuses_only_an_unsatisfiable_one(
    live: dict[str, Any], index: int
) -> None:
    c, reader = live["client"], auth(live["read"])
    url = live["paths"][index]
    whole = c.get(url, headers=reader)
    assert whole.status_code == 200 and len(whole.content) > 20, url
    size = len(whole.content)
    for header in IGNORED:
        r = c.get(url, headers={**reader, "Range": header})
        assert r.status_code == 200, (url, header, r.status_code, r.text[:200])
        assert r.content == whole.content, (url, header)
    for header, (start, end) in SERVED:
        r = c.get(url, headers={**reader, "Range": header})
        assert r.status_code == 206, (url, header, r.status_code, r.text[:200])
        assert r.content == whole.content[start:end], (url, header)
        first = start % size
        last = (size if end is None else end) - 1
        assert r.headers["content-range"] == f"bytes {first}-{last}/{size}", (url, header)
    # two ranges apart: multipart/byteranges
    two = c.get(url, headers={**reader, "Range": "bytes=0-1,5-6"})
    assert two.status_code == 206 and two.headers["content-type"].startswith("multipart/byteranges")
    for header in unsatisfiable(size):
        r = c.get(url, headers={**reader, "Range": header})
        assert r.status_code == 416, (url, header, r.status_code)
        assert r.headers["content-range"] == f"bytes */{size}", (url, header)
    # HEAD says the same (no body)
    head = c.head(url, headers={**reader, "Range": "bytes=--1"})
    assert head.status_code == 200 and head.content == b""


def test_the_parser_follows_rfc_9110_s_grammar() -> None:
    """The shared parser (every route above answers through it) on the forms a file
    route cannot show apart: order kept, ranges past the end left out."""
    from radserve.api.files import parse_range

    assert parse_range("bytes=5-,0-0", 50) == [(5, 50), (0, 1)]
    assert parse_range("bytes=60-70,0-0", 50) == [(0, 1)]  # the satisfiable one is served
    assert parse_range("bytes=-100", 50) == [(0, 50)]
    assert parse_range("bytes=0-" + "9" * 6000, 50) == [(0, 50)]  # no int() digit limit
