"""Errors of the service layer (requests it refuses); the API maps their codes to HTTP."""

from __future__ import annotations

from radserve.errors import InvalidRequestError, RadserveError, UnsupportedMediaError

# InvalidRequestError and UnsupportedMediaError are defined in radserve.errors (the
# DICOMweb gateway raises them too) and re-exported here for the service's callers.


class ResultNotReadyError(RadserveError):
    """The job has no result (yet, or at all): poll its state. ``retryable`` while the
    job is unfinished (asking again later answers); a failed or cancelled job's never
    will."""

    code = "result_not_ready"

    def __init__(self, message: str, *, code: str | None = None, retryable: bool = False):
        super().__init__(message, code=code)
        self.retryable = retryable


class OutputNotFoundError(RadserveError):
    """The job's result has no such output (no key image n, no label map of that kind)."""

    code = "output_not_found"


class SourceRemovedError(RadserveError):
    """What was asked is read from the study's source images, which the retention sweep
    removed (``storage.source_retention_days``): gone for good, not missing."""

    code = "source_removed"


class ResultRemovedError(RadserveError):
    """The job's result files were removed by the retention policy
    (``storage.result_retention_days``): gone for good, not missing."""

    code = "result_removed"


class ModelNotFoundError(RadserveError):
    """An admin action names a model that is not installed on this server."""

    code = "model_not_found"


class InstallNotFoundError(RadserveError):
    """No install record of that id (never made, or pruned with the oldest)."""

    code = "install_not_found"


class InstallsStoppedError(RadserveError):
    """The server is stopping: it takes no install that would run after its answer."""

    code = "stopping"
    retryable = True


__all__ = [
    "InstallNotFoundError",
    "InstallsStoppedError",
    "InvalidRequestError",
    "ModelNotFoundError",
    "OutputNotFoundError",
    "ResultNotReadyError",
    "UnsupportedMediaError",
]
