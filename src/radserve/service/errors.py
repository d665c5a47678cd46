"""Errors of the service layer (requests it refuses); the API maps their codes to HTTP."""

from __future__ import annotations

from radserve.errors import RadserveError, StudyError


class InvalidRequestError(RadserveError):
    """A parameter has a value the server does not understand."""

    code = "invalid_request"


class UnsupportedMediaError(StudyError):
    """An uploaded file is not DICOM, a zip of DICOM, or NIfTI."""

    code = "unsupported_media_type"


class ResultNotReadyError(RadserveError):
    """The job has no result (yet, or at all): poll its state."""

    code = "result_not_ready"


class OutputNotFoundError(RadserveError):
    """The job's result has no such output (no key image n, no label map of that kind)."""

    code = "output_not_found"


__all__ = [
    "InvalidRequestError",
    "OutputNotFoundError",
    "ResultNotReadyError",
    "UnsupportedMediaError",
]
