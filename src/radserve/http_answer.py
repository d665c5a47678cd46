"""What radserve reads of a hospital peer's answer to an outgoing HTTP delivery (a
critical-finding webhook, a FHIR server): its status line and headers, and of its body at
most :data:`ANSWER_BODY_LIMIT` bytes. Every such POST goes through :func:`post`.

The delivery is judged by the status: a 2xx is the acknowledgement, whatever its body
holds or however it ends. Before, the critical webhook and the FHIR client read every
answer whole into memory: a receiver answering 200 with ``Content-Length: 2000000000``
and 2 GB of body drove the server from 6 to 10 GB in 40 s, and a 200 whose body dripped a
byte every 3 s was retried as "no answer within 3 s" though its status came at once.

A body declared longer than the bound is not read at all, one not declared is read up to
the bound: the connection is then closed under the rest. A short body is read to its end
(a webhook's ``ok``; a FHIR server's OperationOutcome, whose codes classify an error), so
that the connection carries the next notice. A body that stops coming (the attempt's
total deadline, :mod:`radserve.http_deadline`, a reset) ends the reading, not the answer:
the status stands. The body is asked for uncompressed (``Accept-Encoding: identity``); one
compressed all the same (gzip, deflate) is inflated to the same bound, another coding is
not read.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

ANSWER_BODY_LIMIT = 64 * 1024  # bytes of an answer's body read at most (its OperationOutcome)
_LIMIT_KIB = ANSWER_BODY_LIMIT // 1024


@dataclass(frozen=True)
class Answer:
    """A peer's answer: its status line and headers, and ``body``, at most
    :data:`ANSWER_BODY_LIMIT` bytes of it; ``body_cut``: why that is not all of it (``""``:
    it is)."""

    status_code: int
    reason_phrase: str
    headers: httpx.Headers = field(default_factory=httpx.Headers)
    body: bytes = b""
    body_cut: str = ""

    def json(self) -> Any:
        """The body as JSON; ``ValueError`` when it is not (a cut body seldom is)."""
        return json.loads(self.body)

    def cut_note(self) -> str:
        """``"; its body ..."`` for an error's reason when the body was cut, else ``""``."""
        return f"; its body {self.body_cut}" if self.body_cut else ""

    def retry_after_s(self, now: dt.datetime | None = None) -> float | None:
        """How long the peer asks to wait before the next attempt (``Retry-After``: a
        number of seconds or an HTTP date, RFC 9110 10.2.3), or None when it says
        nothing readable. A 429 or 503 with it was retried on radserve's own back-off
        (30 s first), however long the server asked for."""
        value = self.headers.get("Retry-After", "").strip()
        if not value:
            return None
        if value.isdigit():
            return float(int(value[:12]))  # a few digits: more is no sane wait
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # "-0000": UTC (RFC 9110 dates are GMT)
            when = when.replace(tzinfo=dt.UTC)
        return max(0.0, (when - (now or dt.datetime.now(dt.UTC))).total_seconds())


def post(
    client: httpx.Client,
    url: str,
    *,
    content: bytes,
    headers: Mapping[str, str],
    timeout: float | None = None,
) -> Answer:
    """POST ``content`` to ``url``; the answer's status line, headers and at most
    :data:`ANSWER_BODY_LIMIT` bytes of its body (see the module docstring). Raises what
    ``client.stream`` raises before the status is in (a timeout, a refused or reset
    connection, a URL the client refuses); nothing after it. ``timeout``: each operation's
    own limit (default: the client's)."""
    sent = {**headers, "Accept-Encoding": "identity"}
    extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    with client.stream("POST", url, content=content, headers=sent, **extra) as response:
        body, cut = _read_bounded(response)
        return Answer(response.status_code, response.reason_phrase, response.headers, body, cut)


def _read_bounded(response: httpx.Response) -> tuple[bytes, str]:
    """At most :data:`ANSWER_BODY_LIMIT` bytes of the body, decoded, and why that is not
    all of it (``""``: it is)."""
    declared = response.headers.get("Content-Length", "").strip()
    if declared.isdigit() and int(declared) > ANSWER_BODY_LIMIT:
        return b"", f"was not read ({declared} bytes declared, over {_LIMIT_KIB} KiB)"
    coding = response.headers.get("Content-Encoding", "identity").strip().lower()
    inflate: Any = None
    if coding in ("gzip", "x-gzip"):
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif coding == "deflate":
        inflate = zlib.decompressobj()
    elif coding not in ("", "identity"):
        return b"", "was not read (a content coding other than gzip or deflate)"
    body = b""
    try:
        for chunk in response.iter_raw():
            if inflate is not None:
                chunk = inflate.decompress(chunk, ANSWER_BODY_LIMIT + 1 - len(body))
            body += chunk
            if len(body) > ANSWER_BODY_LIMIT:
                return body[:ANSWER_BODY_LIMIT], f"was not read past {_LIMIT_KIB} KiB"
    except httpx.TimeoutException:
        return body, "did not come whole in time"
    except httpx.TransportError as exc:
        return body, f"did not come whole ({type(exc).__name__})"
    except zlib.error:
        return body, f"could not be inflated ({coding})"
    return body, ""


__all__ = ["ANSWER_BODY_LIMIT", "Answer", "post"]
