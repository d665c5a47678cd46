"""One error hierarchy for the whole package.

Every error carries a stable ``code`` (stored on failed jobs, mapped to HTTP/DICOM
status at the edges) and a ``retryable`` flag. Messages say what was expected, what
arrived and how to fix it, and never contain patient data.
"""

from __future__ import annotations

QUOTED_CHARS = 64


def quoted(value: object) -> str:
    """``value`` as an error message quotes it: its repr, cut to its first
    :data:`QUOTED_CHARS` characters and "…". What a client sent (a job id in the path, a
    query value, a header line) can be as long as the request head allows (64 KiB): a
    message that echoes it whole is a 64 KiB answer, log line and stored error. Nothing
    (None, empty) is "(none)"."""
    if value is None or value == "":
        return "(none)"
    text = str(value)
    return repr(text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + "…")


class RadserveError(Exception):
    """Base class: a failure radserve understands and can report."""

    code: str = "radserve_error"
    retryable: bool = False
    # a dependency is away (the database): not the job's fault, so a job waits it out
    # (retried with back-off until its timeout) without using up its retries
    outage: bool = False

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code


class StudyError(RadserveError):
    """The input study cannot be turned into a trustworthy volume."""

    code = "study_invalid"
    # refused for what one model asks of the study (its declared input domain, a channel
    # series, a SUV): another version of that model may take it (is_study_fault)
    depends_on_model: bool = False


class NotDicomError(StudyError):
    code = "not_dicom"


class UnsupportedModalityError(StudyError):
    code = "unsupported_modality"


class GeometryError(StudyError):
    """Slices do not form one regular, consistent volume."""

    code = "geometry_invalid"


class DecodeError(StudyError):
    """Pixel data could not be decoded (truncated file, missing decoder)."""

    code = "decode_failed"


class EmptyUploadError(StudyError):
    """An upload or request body that holds no file."""

    code = "empty_upload"


class InputDomainError(StudyError):
    """The study lies outside a model's declared input domain and the ingest policy
    (``ingest.input_domain: refuse``) refuses such studies."""

    code = "outside_input_domain"
    depends_on_model = True  # each version declares its own domain


def is_study_fault(code: str | None) -> bool:
    """Whether a failed job's ``code`` is the input study's own fault whatever model
    version ran it (a :class:`StudyError` that does not depend on the model, wherever its
    subclass is defined): a cut-off file fails on every version alike, so it says nothing
    about the one that was chosen for it."""
    if code is None:
        return False
    found, seen = [StudyError], set()
    while found:
        cls = found.pop()
        if not cls.depends_on_model:
            seen.add(cls.code)
        found.extend(cls.__subclasses__())
    return code in seen


class InvalidRequestError(RadserveError):
    """A parameter has a value the server does not understand (HTTP, DICOMweb, CLI)."""

    code = "invalid_request"


class UnsupportedMediaError(StudyError):
    """An uploaded file or body is not DICOM, a zip of DICOM, or NIfTI."""

    code = "unsupported_media_type"


class ModelError(RadserveError):
    """A model bundle is missing, malformed or not allowed to serve."""

    code = "model_invalid"


class UnknownModelError(ModelError):
    code = "model_unknown"


class VariantRejectedError(ModelError):
    """A precision variant that failed its accuracy gate was asked for."""

    code = "variant_rejected"


class BundleRejectedError(ModelError):
    """A bundle offered for install is malformed, inconsistent with its ONNX graph, or
    needs what this host cannot give (model lifecycle)."""

    code = "bundle_rejected"


class BundleExistsError(ModelError):
    """That name and version is installed already (a version is never overwritten)."""

    code = "bundle_exists"


class DeploymentError(ModelError):
    """A deployment change that cannot be made (no canary to promote, nothing to roll
    back to, a version that may not serve)."""

    code = "deployment_invalid"


class PipelineError(RadserveError):
    code = "pipeline_invalid"


class InferenceError(RadserveError):
    code = "inference_failed"
    retryable = True


class DeviceMemoryError(InferenceError):
    """A batch that did not fit in the device's memory even as small as it can be run (one
    sample, or a graph's fixed batch size): the host's state (other models, other
    studies, a GPU shared), not a fault of the model. Raised instead of a plain
    :class:`InferenceError` so that whoever counts model faults (the scheduler's circuit
    breaker) leaves it out; retryable, as every inference error."""


class ReportError(RadserveError):
    code = "report_failed"
