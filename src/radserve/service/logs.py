"""The server's structured, redacted logging (kept here for the service's importers; the
implementation is :mod:`radserve.security.logs`, light enough for the CLI to import)."""

from radserve.security.logs import (
    QUIET_LOGGERS,
    JsonFormatter,
    RedactingFilter,
    capture_warnings,
    configure_logging,
    redact,
    redact_names,
)

__all__ = [
    "QUIET_LOGGERS",
    "JsonFormatter",
    "RedactingFilter",
    "capture_warnings",
    "configure_logging",
    "redact",
    "redact_names",
]
