"""Structured logs: one JSON object per line, with the job id as a field of its own, and
nothing from a DICOM header in clear.

radserve's own messages never carry patient data (names, IDs, birth dates): errors
name files by position, reports are de-identified, and patient attributes have redacted
``repr``\\ s. Third-party libraries are less careful: pydicom warns with the offending
value (``Invalid value for VR UI: 'Doe^John'``), through both its logger and the
``warnings`` module (which, left alone, prints a plain ``UserWarning`` line on stderr),
and pynetdicom logs whole datasets at DEBUG. So:

* :func:`configure_logging` routes every ``warnings.warn`` through the logger
  ``py.warnings`` (no plain line on stderr), holds the dataset-logging libraries at
  WARNING, and puts a :class:`RedactingFilter` on its handler;
* the filter rewrites every record that does *not* come from radserve, uvicorn or
  alembic with :func:`redact`, which errs on redacting: quoted values, PN-like
  ``a^b`` tokens, dates, dotted UIDs and digit runs of four or more are replaced by
  ``<redacted>``. radserve's own records get :func:`redact_names` (PN-like tokens only),
  and every traceback text is redacted in full, since exception messages quote values;
* identical library messages are logged once (after redaction, up to 1,000 distinct
  ones), so a study with a bad header gives one line per kind of problem, not one per
  file.

What is not caught: a value a library logs unquoted that is neither PN-like, a date, a
UID nor a digit run (e.g. a bare surname word). pydicom, pynetdicom and highdicom
quote the values they report.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import threading
from typing import Any, TextIO

from radserve.log_routing import WARNINGS_LOGGER, capture_warnings

_JOB_ID = re.compile(r"\bjob ([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\b")
# libraries that may log patient attributes at DEBUG/INFO
QUIET_LOGGERS = ("pynetdicom", "pydicom", "highdicom")
# loggers whose messages are trusted to carry no header values (redact_names only)
SAFE_PREFIXES = ("radserve", "uvicorn", "alembic")
REDACTED = "<redacted>"
_STANDARD = set(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's ANSI-coloured copy of msg
}
# chatty at INFO with nothing an operator needs (schema migration steps)
_TERSE_LOGGERS = ("alembic",)
_MAX_REMEMBERED = 1000

# --- redaction -----------------------------------------------------------------------------
_QUOTED = re.compile(r"""(?P<q>['"])(?:(?!(?P=q)).)*(?P=q)""", re.DOTALL)
_PN_LIKE = re.compile(r"""[^\s'"<>()\[\],;=]*\^[^\s'"<>()\[\],;=]*""")
_ISO_DATE = re.compile(r"\b\d{4}[-./]\d{2}[-./]\d{2}\b")
_UID = re.compile(r"\b\d+(?:\.\d+){2,}\b")
_DIGIT_RUN = re.compile(r"[\w-]*\d{4,}[\w-]*")
_WARNING_PREFIX = re.compile(r"^\w*(Warning|Error): ")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")


def redact_names(text: str) -> str:
    """Replace PN-like tokens (``Family^Given``) by ``<redacted>``."""
    return _PN_LIKE.sub(REDACTED, text)


def redact(text: str) -> str:
    """Replace anything that may be a header value by ``<redacted>``, keeping job ids.

    Quoted strings go first (whatever they hold), then PN-like tokens, dates, dotted
    UIDs and digit runs (IDs, DA/DT values). URLs in angle brackets survive only if they
    hold no such token."""
    kept: list[str] = []

    def keep(match: re.Match[str]) -> str:
        kept.append(match.group(0))
        return f"\x00{len(kept) - 1}\x00"

    text = _UUID.sub(keep, text)
    text = _QUOTED.sub(lambda m: f"{m.group('q')}{REDACTED}{m.group('q')}", text)
    for pattern in (_PN_LIKE, _ISO_DATE, _UID, _DIGIT_RUN):
        text = pattern.sub(REDACTED, text)
    return re.sub(r"\x00(\d+)\x00", lambda m: kept[int(m.group(1))], text)


ACCESS_LOGGER = "uvicorn.access"


# a path segment the access log keeps: a route's word (lower case, no run of four
# digits: no ID), a job's UUID, a DICOM UID (a root 0, 1 or 2, three parts at least: not
# a dotted date), a built asset's file name (the console's bundle: index-D3f9aB12.js);
# anything else a client typed there may be a name or an ID (``GET /v1/jobs/ZZPID123``
# and ``/v1/jobs/SMITH^JOHN`` were logged in clear)
_KEPT_SEGMENT = re.compile(
    r"(?!.*\d{4})[a-z0-9][a-z0-9._-]{0,39}"
    r"|[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"
    r"|[0-2](\.[0-9]+){2,}"
    r"|[A-Za-z0-9_-]{1,64}\.(js|css|map|png|svg|ico|woff2?|html|json|wasm)"
)


def redact_query(path: str) -> str:
    """``path`` with every query value replaced by ``<redacted>``, the keys kept (they
    say what was searched for, the values whom), and every path segment that is not a
    route's word, a job id or a UID."""
    base, mark, query = path.partition("?")
    base = "/".join(
        part if not part or _KEPT_SEGMENT.fullmatch(part) else REDACTED for part in base.split("/")
    )
    if not mark:
        return base
    parts = []
    for item in query.split("&"):
        key, equals, value = item.partition("=")
        parts.append(f"{key}={REDACTED}" if equals and value else item)
    return f"{base}?{'&'.join(parts)}"


def trusted(logger_name: str) -> bool:
    return any(logger_name == p or logger_name.startswith(p + ".") for p in SAFE_PREFIXES)


class RedactingFilter(logging.Filter):
    """Rewrites each record before any handler formats it (see the module docstring);
    drops repeats of a library message already logged."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        # another handler's filter may have redacted this record already; the repeat
        # check below is still this filter's own (each handler gets each message once)
        if not getattr(record, "_radserve_redacted", False):
            self._redact(record)
        if trusted(record.name):
            return True
        # pydicom both logs and warns each problem: one key for the two copies
        key = _WARNING_PREFIX.sub("", record.msg)
        with self._lock:
            if key in self._seen:
                return False
            if len(self._seen) < _MAX_REMEMBERED:
                self._seen.add(key)
        return True

    @staticmethod
    def _redact(record: logging.LogRecord) -> None:
        if record.name == ACCESS_LOGGER and isinstance(record.args, tuple):
            # (client, method, path with query, version, status): a QIDO-RS search's
            # query names the patient (PatientName=, PatientID=, PatientBirthDate=)
            record.args = tuple(
                redact_query(a) if i == 2 and isinstance(a, str) else a
                for i, a in enumerate(record.args)
            )
        is_trusted = trusted(record.name)
        scrub = redact_names if is_trusted else redact
        try:
            message = record.getMessage()
        except Exception:  # a library's bad format string: keep the template only
            message = str(record.msg)
        record.msg, record.args = scrub(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        record.exc_info = None if record.exc_text else record.exc_info
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        if not is_trusted:
            for key, value in list(vars(record).items()):
                if key not in _STANDARD and not key.startswith("_") and isinstance(value, str):
                    setattr(record, key, redact(value))
        record._radserve_redacted = True


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
        if record.exc_text:
            out["exc"] = record.exc_text
        elif record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


THREADS_LOGGER = "threading"


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """An exception that ends a thread, as one redacted log record. Python's default
    hook printed the raw traceback on stderr, beside the JSON lines: a peer's malformed
    association request ended pynetdicom's acceptor thread that way, and its exception
    text may quote what the peer sent."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger(THREADS_LOGGER).error(
        "uncaught %s in thread %s",
        args.exc_type.__name__,
        name,
        exc_info=(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback),
    )


def configure_logging(
    level: int = logging.INFO, *, json_lines: bool = True, stream: TextIO | None = None
) -> None:
    """Send every log line, every Python warning and every exception that ends a thread
    to stderr (or ``stream``), as JSON (default) or plain text, redacted by
    :class:`RedactingFilter`."""
    handler = logging.StreamHandler(stream)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
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
    capture_warnings()
    threading.excepthook = _log_thread_exception


__all__ = [
    "QUIET_LOGGERS",
    "WARNINGS_LOGGER",
    "JsonFormatter",
    "RedactingFilter",
    "capture_warnings",
    "configure_logging",
    "redact",
    "redact_names",
    "redact_query",
]
