"""Structured logs: one JSON object per line, with the job id as a field of its own.

radserve's own messages never carry patient data (names, IDs, birth dates): errors
name files by position, reports are de-identified, and patient attributes have redacted
``repr``\\ s. Third-party libraries are less careful: pynetdicom logs whole datasets at
DEBUG, so its loggers are held at WARNING whatever the level asked for.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from typing import Any

_JOB_ID = re.compile(r"\bjob ([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\b")
# libraries that may log patient attributes at DEBUG/INFO
QUIET_LOGGERS = ("pynetdicom", "pydicom", "highdicom")
_STANDARD = set(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's ANSI-coloured copy of msg
}
# chatty at INFO with nothing an operator needs (schema migration steps)
_TERSE_LOGGERS = ("alembic",)


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "job_id"?, "exc"?, ...extra}`` per line."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": message,
        }
        job_id = getattr(record, "job_id", None)
        if job_id is None and (match := _JOB_ID.search(message)) is not None:
            job_id = match.group(1)
        if job_id is not None:
            out["job_id"] = job_id
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out and not key.startswith("_"):
                out[key] = value if isinstance(value, str | int | float | bool) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: int = logging.INFO, *, json_lines: bool = True) -> None:
    """Send every log line to stderr, as JSON (default) or plain text."""
    handler = logging.StreamHandler()
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in (*QUIET_LOGGERS, *_TERSE_LOGGERS):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers = []
        uv.propagate = True


__all__ = ["QUIET_LOGGERS", "JsonFormatter", "configure_logging"]
