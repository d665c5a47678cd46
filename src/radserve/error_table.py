"""One table from error class to what each edge answers: HTTP status, STOW-RS Failure
Reason, DICOM C-STORE status and CLI exit status.

Looked up along the exception's MRO, as Starlette finds an exception handler: an
error without its own row answers as its nearest ancestor that has one (``StudyError``
subclasses are 422 unless they say otherwise). Rows are keyed by the class's import
path (``module.QualName``) rather than the class object so that this module imports
nothing of radserve but :mod:`radserve.errors`: the API, the DICOMweb gateway, the
DICOM SCP and the CLI all read it without an import cycle. ``tests/unit/
test_error_table.py`` proves every key names a real :class:`RadserveError` subclass,
every subclass reaches a row below the root, and a 500 is never inherited.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from radserve.errors import RadserveError

# DICOM values (PS3.18 Table I.2-2 Failure Reason; PS3.4 C-STORE status)
PROCESSING_FAILURE = 0x0110
OUT_OF_RESOURCES = 0xA700
CANNOT_UNDERSTAND = 0xC000


@dataclass(frozen=True)
class ErrorMapping:
    """What one error class answers at each edge."""

    http: int
    # STOW-RS Failure Reason (0008,1197) of the instances of a study that was refused
    stow: int = PROCESSING_FAILURE
    # C-STORE response status when the storage SCP refuses an instance for this error
    dicom: int = CANNOT_UNDERSTAND
    # `radserve` command exit status
    exit: int = 2


_STUDY = ErrorMapping(422)  # what was sent cannot become a trustworthy volume
_NOT_UNDERSTOOD = ErrorMapping(422, stow=CANNOT_UNDERSTAND)
_SERVER_FAULT = ErrorMapping(500)  # radserve's own failure or misconfiguration
_BUSY = ErrorMapping(503)  # the server cannot take it now; try again later

TABLE: dict[str, ErrorMapping] = {
    # the root: reached only by a bare RadserveError (every subclass has a row or a family)
    "radserve.errors.RadserveError": _SERVER_FAULT,
    # --- what was sent ---------------------------------------------------------------
    "radserve.errors.StudyError": _NOT_UNDERSTOOD,
    "radserve.errors.NotDicomError": _NOT_UNDERSTOOD,
    "radserve.errors.EmptyUploadError": ErrorMapping(400, stow=CANNOT_UNDERSTAND),
    "radserve.errors.UnsupportedMediaError": ErrorMapping(415, stow=CANNOT_UNDERSTAND),
    "radserve.errors.UnsupportedModalityError": _STUDY,
    "radserve.errors.GeometryError": _STUDY,
    "radserve.errors.DecodeError": _STUDY,
    "radserve.errors.InputDomainError": _STUDY,  # ingest.input_domain: refuse
    "radserve.ingest.suv.SuvConversionError": _STUDY,  # a PET channel without a usable SUV
    "radserve.pipeline.channels.ChannelSeriesError": _STUDY,  # a model's other series
    "radserve.ingest.discover.SeveralStudiesError": _STUDY,  # one upload, two studies
    "radserve.ingest.validate.LossyInputError": _STUDY,  # ingest.lossy_input: refuse
    "radserve.zip_members.ArchiveRejectedError": _STUDY,
    "radserve.ingest.sources.InputTooLargeError": _STUDY,
    # a Type 1 source value over its VR limit that neither a cut nor empty would keep valid
    "radserve.report.shortened.CopiedValueTooLongError": _STUDY,
    # a series DICOM SEG/SR cannot reference as it is made (mixed Enhanced instances)
    "radserve.report.dicom.frames.SourceFramesError": _STUDY,
    "radserve.service.own_uploads.OwnResultsOnlyError": _STUDY,
    "radserve.store.files.UploadTooLargeError": ErrorMapping(413, stow=OUT_OF_RESOURCES),
    "radserve.spool.TooManyPartsOnDiskError": ErrorMapping(413, stow=OUT_OF_RESOURCES),
    "radserve.errors.PipelineError": ErrorMapping(422),
    "radserve.errors.UnknownModelError": ErrorMapping(422),
    "radserve.errors.VariantRejectedError": ErrorMapping(422),
    # model lifecycle (radserve.lifecycle)
    "radserve.errors.BundleRejectedError": ErrorMapping(422),
    "radserve.errors.BundleExistsError": ErrorMapping(409),
    "radserve.errors.DeploymentError": ErrorMapping(409),
    "radserve.gateway.errors.InstanceRejectedError": ErrorMapping(422),
    # --- what was asked --------------------------------------------------------------
    "radserve.errors.InvalidRequestError": ErrorMapping(400),
    "radserve.gateway.dicomweb.multipart.MalformedMultipartError": ErrorMapping(400),
    "radserve.store.errors.InvalidCursorError": ErrorMapping(400),
    "radserve.store.errors.UnstorableValueError": ErrorMapping(400),
    "radserve.api.errors.UploadIncompleteError": ErrorMapping(400),
    "radserve.api.errors.UnauthenticatedError": ErrorMapping(401),
    "radserve.api.errors.ForbiddenError": ErrorMapping(403),
    "radserve.store.errors.JobNotFoundError": ErrorMapping(404),
    "radserve.store.errors.ApiKeyNotFoundError": ErrorMapping(404),
    "radserve.store.errors.OutboxItemNotFoundError": ErrorMapping(404),
    "radserve.service.errors.OutputNotFoundError": ErrorMapping(404),
    "radserve.service.errors.SourceRemovedError": ErrorMapping(410),  # retention removed it
    "radserve.service.errors.ResultRemovedError": ErrorMapping(410),  # retention, too
    "radserve.service.errors.ModelNotFoundError": ErrorMapping(404),
    "radserve.service.errors.InstallNotFoundError": ErrorMapping(404),
    "radserve.gateway.dicomweb.wado.DicomObjectNotFoundError": ErrorMapping(404),
    "radserve.media_types.NotAcceptableError": ErrorMapping(406),
    "radserve.api.errors.RequestTimeoutError": ErrorMapping(408),
    # conflicts with the state of a job or row
    "radserve.store.errors.InvalidTransitionError": ErrorMapping(409),
    "radserve.store.errors.JobExistsError": ErrorMapping(409),
    "radserve.store.errors.ResultAlreadyRecordedError": ErrorMapping(409),
    "radserve.store.errors.OutboxNotRetryableError": ErrorMapping(409),
    "radserve.service.errors.ResultNotReadyError": ErrorMapping(409),
    "radserve.scheduling.errors.DuplicateJobError": ErrorMapping(409),
    "radserve.scheduling.errors.JobCancelledError": ErrorMapping(409),
    "radserve.scheduling.errors.NotWaitingError": ErrorMapping(409),
    "radserve.inference.tasks.InferenceCancelledError": ErrorMapping(409),
    "radserve.scheduling.errors.JobTimeoutError": ErrorMapping(504),
    # --- the server cannot take it now -----------------------------------------------
    "radserve.scheduling.errors.QueueFullError": ErrorMapping(503, stow=OUT_OF_RESOURCES),
    "radserve.scheduling.errors.ModelUnavailableError": _BUSY,
    "radserve.service.errors.InstallsStoppedError": _BUSY,
    # a newer radserve migrated the database beneath this server: another replica takes it
    "radserve.service.schema_watch.SchemaChangedError": ErrorMapping(
        503, stow=OUT_OF_RESOURCES, dicom=OUT_OF_RESOURCES
    ),
    "radserve.errors.ModelError": _BUSY,  # an installed bundle is broken: not the caller's
    "radserve.errors.InferenceError": _BUSY,  # retryable
    "radserve.store.errors.StoreError": _BUSY,
    "radserve.store.files.StorageUnavailableError": ErrorMapping(
        503, stow=OUT_OF_RESOURCES, dicom=OUT_OF_RESOURCES
    ),
    "radserve.api.auth.AuditUnavailableError": _BUSY,
    "radserve.api.proxy.ServingUnavailableError": _BUSY,  # an API reader's upstream
    "radserve.gateway.errors.OutOfResourcesError": ErrorMapping(503, dicom=OUT_OF_RESOURCES),
    # --- radserve's own failures and misconfiguration (deliberately 500) -------------
    "radserve.errors.ReportError": _SERVER_FAULT,
    "radserve.bench.errors.BenchError": _SERVER_FAULT,  # radserve bench: a scenario failed
    "radserve.scheduling.errors.SchedulingError": _SERVER_FAULT,
    "radserve.scheduling.ray_worker.RayExecutorError": _SERVER_FAULT,
    # every Ray worker that ran a study's batch died: a job's failure, never a request's
    "radserve.scheduling.ray_executor.BatchLostError": _SERVER_FAULT,
    "radserve.store.audit.AuditKeyMissingError": _SERVER_FAULT,
    "radserve.store.audit.AuditKeyMismatchError": _SERVER_FAULT,
    "radserve.audit.seal.AuditKeyError": _SERVER_FAULT,
    "radserve.config.ConfigError": _SERVER_FAULT,
    "radserve.tls.TlsConfigError": _SERVER_FAULT,
    "radserve.gateway.errors.GatewayError": _SERVER_FAULT,
    "radserve.gateway.errors.GatewayConfigError": _SERVER_FAULT,
}


def class_key(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@cache
def _lookup(cls: type[BaseException]) -> tuple[str, ErrorMapping]:
    for base in cls.__mro__:
        mapping = TABLE.get(class_key(base))
        if mapping is not None:
            return class_key(base), mapping
    return class_key(RadserveError), TABLE[class_key(RadserveError)]


def row_for(error: BaseException | type[BaseException]) -> str:
    """The key of the row that answers for ``error`` (an exception or its class)."""
    return _lookup(error if isinstance(error, type) else type(error))[0]


def lookup(error: BaseException | type[BaseException]) -> ErrorMapping:
    """What ``error`` (an exception or its class) answers at each edge."""
    return _lookup(error if isinstance(error, type) else type(error))[1]


__all__ = [
    "CANNOT_UNDERSTAND",
    "OUT_OF_RESOURCES",
    "PROCESSING_FAILURE",
    "TABLE",
    "ErrorMapping",
    "class_key",
    "lookup",
    "row_for",
]
