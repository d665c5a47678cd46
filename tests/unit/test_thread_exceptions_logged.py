"""An exception that ends a thread is one redacted JSON line, not Python's raw traceback
on stderr: a malformed association request ended pynetdicom's acceptor thread with an
``IndexError`` traceback beside the JSON lines (trial, session 43)."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from radserve.security.logs import configure_logging


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    hook, root = threading.excepthook, logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out = io.StringIO()
    configure_logging(stream=out)
    try:
        yield out
    finally:
        threading.excepthook = hook
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def test_a_thread_s_uncaught_exception_is_one_redacted_json_line(stream: io.StringIO) -> None:
    def fail() -> None:
        raise IndexError("peer sent 'DOE^JOHN' PID 19010203")

    thread = threading.Thread(target=fail, name="AcceptorThread")
    thread.start()
    thread.join()
    lines = [line for line in stream.getvalue().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert record["msg"] == "uncaught IndexError in thread AcceptorThread"
    assert record["level"] == "error" and "IndexError" in record["exc"]
    assert "DOE" not in lines[0] and "19010203" not in lines[0]


def test_system_exit_ends_a_thread_quietly(stream: io.StringIO) -> None:
    thread = threading.Thread(target=lambda: (_ for _ in ()).throw(SystemExit(0)))
    thread.start()
    thread.join()
    assert stream.getvalue() == ""
