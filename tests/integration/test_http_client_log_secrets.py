"""A receiver URL's password and query values stay out of radserve's log.

Probe of 2026-12-06: with a critical receiver at
``http://admin:hunter2@127.0.0.1:9102/hook?apikey=QUERYSECRET``, httpx's INFO line
``HTTP Request: POST http://admin:hunter2@<redacted>:<redacted>/hook?apikey=QUERYSECRET``
reached the server log (the handlers' redaction takes digits and quotes, not a URL's
letters). Real logging set-up (the server's JSON and the CLI's plain text), real httpx
POSTs to a real loopback receiver."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.factories.fhir_server import FhirServer

from radserve.critical.push import CriticalOutbox, Receiver
from radserve.fhir.delivery import FhirClient, FhirDestination
from radserve.security.logs import configure_logging
from radserve.store import init_store
from radserve.store.outbox import OutboxStore

SECRETS = ("hunter2", "QUERYSECRET", "FRAGSECRET", "s3cret")


@pytest.fixture(params=[(logging.INFO, True), (logging.DEBUG, False)], ids=["json", "text"])
def server_log(request: pytest.FixtureRequest) -> Iterator[io.StringIO]:
    """radserve's logging into a buffer; the set-up before it put back."""
    level, json_lines = request.param
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "httpx", "httpcore")
    saved = {
        name: (logger.handlers[:], logger.propagate, logger.level)
        for name in names
        for logger in [logging.getLogger(name)]
    }
    stream = io.StringIO()
    configure_logging(level, json_lines=json_lines, stream=stream)
    yield stream
    for name, (handlers, propagate, old_level) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate, logger.level = handlers, propagate, old_level


def _with_credentials(url: str) -> str:
    return url.replace("http://", "http://admin:hunter2@") + "?apikey=QUERYSECRET&x=1"


def test_a_webhook_url_with_credentials_is_logged_without_them(
    server_log: io.StringIO, tmp_path: Path
) -> None:
    store = init_store(f"sqlite:///{tmp_path / 'radserve.db'}")
    try:
        with FhirServer() as hook:
            box = CriticalOutbox(
                OutboxStore(store.engine), [Receiver("ward", _with_credentials(hook.url))]
            )
            try:
                box.enqueue({"id": "n-1", "study_instance_uid": "1.2"}, folder=tmp_path / "o")
                assert box.deliver_pending().sent == 1
            finally:
                box.close()
            assert hook.received[0].path.endswith("apikey=QUERYSECRET&x=1")  # sent whole
    finally:
        store.close()
    text = server_log.getvalue()
    assert "HTTP Request: POST" in text  # the line is still there, for the operator
    assert "admin:***@" in text and "apikey=***" in text
    for secret in SECRETS:
        assert secret not in text, secret


def test_a_fhir_url_with_credentials_is_logged_without_them(server_log: io.StringIO) -> None:
    client = FhirClient()
    with FhirServer() as fhir:
        url = fhir.url.replace("http://", "http://svc:s3cret@") + "?token=QUERYSECRET"
        try:
            client.post(FhirDestination(url), b'{"resourceType": "Bundle"}')
        finally:
            client.close()
        assert len(fhir.received) == 1
    text = server_log.getvalue()
    assert "HTTP Request: POST" in text
    for secret in SECRETS:
        assert secret not in text, secret


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://admin:hunter2@h:1/p?apikey=QUERYSECRET", "http://admin:***@h:1/p?apikey=***"),
        ("https://QUERYSECRET@h/p", "https://***@h/p"),
        ("http://h/p?a&b=&c=QUERYSECRET#FRAGSECRET", "http://h/p?a&b=&c=***#***"),
        ("http://h/p", "http://h/p"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    from radserve.log_routing import redact_url

    assert redact_url(url) == shown
