"""Store errors; each has a stable ``code`` the API maps to an HTTP status."""

from __future__ import annotations

from radserve.errors import RadserveError


class StoreError(RadserveError):
    """The database cannot do what was asked (unreachable, wrong schema, bad URL)."""

    code = "store_error"
    retryable = True


class DatabaseUnavailableError(StoreError):
    """The database did not answer (down, restarting, locked past its timeout, cut off):
    the one store error worth waiting out."""

    code = "store_error"
    retryable = True
    outage = True


class NoDataError(StoreError):
    """A command that only reads was pointed at a data dir that holds no store yet (a
    wrong folder, or a server never started there): it says so and writes nothing."""

    code = "no_data_dir"
    retryable = False


class SchemaNotCurrentError(StoreError):
    """A command that only reads found the store at another schema revision than this
    radserve's: it never upgrades one (older servers may still be running on it)."""

    code = "schema_not_current"
    retryable = False


class UnstorableValueError(StoreError):
    """A value the database cannot hold or compare (a NUL character in a text for
    PostgreSQL, a string past its column's length, a number out of range): the caller's
    input, not the database's state."""

    code = "invalid_request"
    retryable = False


class JobNotFoundError(StoreError):
    code = "job_not_found"
    retryable = False


class InvalidTransitionError(StoreError):
    """A job state change the state machine forbids (e.g. cancelling a finished job)."""

    code = "invalid_transition"
    retryable = False


class ResultAlreadyRecordedError(StoreError):
    """A second result for a job: results are recorded exactly once; discard this one."""

    code = "result_already_recorded"
    retryable = False

    def __init__(self, message: str, *, existing_result_path: str | None) -> None:
        super().__init__(message)
        self.existing_result_path = existing_result_path


class JobExistsError(StoreError):
    """A job with this id is already stored (ids are never reused)."""

    code = "job_exists"
    retryable = False


class OutboxNotRetryableError(StoreError):
    """An outbox row that is not pending or failed_permanent (or changed meanwhile)."""

    code = "outbox_not_retryable"
    retryable = False


class OutboxItemNotFoundError(StoreError):
    code = "outbox_item_not_found"
    retryable = False


class ApiKeyNotFoundError(StoreError):
    code = "api_key_not_found"
    retryable = False


class InvalidCursorError(StoreError):
    code = "invalid_cursor"
    retryable = False
