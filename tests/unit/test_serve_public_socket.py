"""``radserve serve`` with API readers binds the public socket in the serving process:
binding it must leave radserve's logging as it is, so the serving process's uvicorn
lines (start, stop, errors, access log) stay JSON records through the redacting filter
(found with ``server.read_processes: 2`` by tests/e2e/test_phi_in_logs.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from radserve.commands.serve import bind_public_socket
from radserve.security.logs import configure_logging


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """radserve's JSON logging into a buffer; the logging set-up before it put back."""
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access")
    saved = {
        name: (logger.handlers[:], logger.propagate, logger.level)
        for name in names
        for logger in [logging.getLogger(name)]
    }
    stream = io.StringIO()
    configure_logging(logging.INFO, json_lines=True, stream=stream)
    yield stream
    for name, (handlers, propagate, level) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate, logger.level = handlers, propagate, level
    logging.captureWarnings(False)


def test_binding_the_public_socket_keeps_uvicorn_lines_in_radserve_json(
    json_log: io.StringIO,
) -> None:
    sock = bind_public_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        logging.getLogger("uvicorn.error").info("Shutting down")
        logging.getLogger("uvicorn.access").info('127.0.0.1 - "GET /v1/jobs HTTP/1.1" 200')
    finally:
        sock.close()
    records = [json.loads(line) for line in json_log.getvalue().splitlines()]
    messages = [(r["logger"], r["msg"]) for r in records]
    assert any(f"127.0.0.1:{port}" in str(m) for _, m in messages), messages
    assert [m for _, m in messages][-2:] == [
        "Shutting down",
        '127.0.0.1 - "GET /v1/jobs HTTP/1.1" 200',
    ]
