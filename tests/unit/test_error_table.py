"""The one error table (radserve.error_table): every RadserveError subclass answers a
deliberate HTTP status, STOW-RS Failure Reason, DICOM status and CLI exit status."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import pytest

import radserve
from radserve import error_table
from radserve.error_table import (
    CANNOT_UNDERSTAND,
    OUT_OF_RESOURCES,
    PROCESSING_FAILURE,
    TABLE,
    class_key,
    lookup,
    row_for,
)
from radserve.errors import RadserveError, StudyError, is_study_fault

ROOT = class_key(RadserveError)

# Optional extras (pyproject): modules that need them cannot import where they are not
# installed, as on a fresh machine running `make test`; CI installs them, so there every
# module is walked.
OPTIONAL_PACKAGES = {"torch", "nnunetv2", "monai", "dynamic_network_architectures"}


def _missing_optional(exc: ImportError) -> bool:
    top = (exc.name or "").split(".")[0]
    return top in OPTIONAL_PACKAGES and importlib.util.find_spec(top) is None


def _import_everything() -> dict[str, str]:
    """Import every module (so every error class is defined); the ones that fail."""
    failed = {}
    for module in pkgutil.walk_packages(radserve.__path__, "radserve.", onerror=lambda _: None):
        if module.name.endswith("__main__") or ".migrations" in module.name:
            continue  # command-line entry points and alembic scripts run on import
        try:
            importlib.import_module(module.name)
        except ImportError as exc:
            if _missing_optional(exc):
                continue
            failed[module.name] = f"{type(exc).__name__}: {exc}"
    return failed


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


IMPORT_FAILURES = _import_everything()
ERRORS = sorted(_subclasses(RadserveError), key=class_key)


def test_every_module_imports() -> None:
    assert not IMPORT_FAILURES, f"error classes of these modules are not checked: {IMPORT_FAILURES}"


def test_the_walk_finds_the_error_families() -> None:
    keys = {class_key(c) for c in ERRORS}
    assert "radserve.store.errors.JobNotFoundError" in keys
    assert "radserve.scheduling.errors.QueueFullError" in keys
    assert len(ERRORS) >= 40


def test_every_row_names_a_radserve_error_class() -> None:
    known = {class_key(c) for c in (RadserveError, *ERRORS)}
    stale = sorted(set(TABLE) - known)
    assert not stale, f"rows for classes that do not exist (moved or renamed?): {stale}"


@pytest.mark.parametrize("cls", ERRORS, ids=class_key)
def test_every_subclass_reaches_a_row_below_the_root(cls: type[RadserveError]) -> None:
    assert row_for(cls) != ROOT, f"{class_key(cls)} falls through to the root row (500)"


@pytest.mark.parametrize("cls", ERRORS, ids=class_key)
def test_a_500_is_never_inherited(cls: type[RadserveError]) -> None:
    if lookup(cls).http == 500:
        assert row_for(cls) == class_key(cls), (
            f"{class_key(cls)} answers {lookup(cls).http} only through {row_for(cls)}: "
            "give it its own row if a server fault is what it means"
        )


@pytest.mark.parametrize("cls", ERRORS, ids=class_key)
def test_every_row_is_a_valid_answer(cls: type[RadserveError]) -> None:
    mapping = lookup(cls)
    assert 400 <= mapping.http <= 599
    assert mapping.stow in (PROCESSING_FAILURE, OUT_OF_RESOURCES, CANNOT_UNDERSTAND)
    assert mapping.dicom in (OUT_OF_RESOURCES, CANNOT_UNDERSTAND)
    assert mapping.exit == 2  # every RadserveError ends `radserve` with status 2


@pytest.mark.parametrize(
    ("key", "http"),
    [
        # the conflicts that once fell through to 500/503
        ("radserve.scheduling.errors.DuplicateJobError", 409),
        ("radserve.store.errors.JobExistsError", 409),
        ("radserve.store.errors.OutboxNotRetryableError", 409),
        ("radserve.store.errors.OutboxItemNotFoundError", 404),
        ("radserve.errors.EmptyUploadError", 400),
        ("radserve.errors.UnsupportedMediaError", 415),
        ("radserve.store.files.UploadTooLargeError", 413),
        ("radserve.errors.GeometryError", 422),
        ("radserve.scheduling.errors.QueueFullError", 503),
        ("radserve.store.errors.JobNotFoundError", 404),
        ("radserve.gateway.dicomweb.wado.DicomObjectNotFoundError", 404),
        ("radserve.media_types.NotAcceptableError", 406),
        ("radserve.api.errors.UnauthenticatedError", 401),
        ("radserve.errors.ReportError", 500),
    ],
)
def test_specific_errors_answer_as_intended(key: str, http: int) -> None:
    cls = next(c for c in ERRORS if class_key(c) == key)
    assert lookup(cls).http == http


def test_an_error_without_its_own_row_answers_as_its_family() -> None:
    from radserve.ingest.headers import UnreadableHeaderError

    assert row_for(UnreadableHeaderError) == "radserve.errors.NotDicomError"
    assert lookup(UnreadableHeaderError(ValueError("x"))).stow == CANNOT_UNDERSTAND

    class SiteSpecificStudyError(radserve.errors.StudyError):
        code = "site_rule"

    assert lookup(SiteSpecificStudyError("x")).http == 422


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("radserve.scheduling.errors.QueueFullError", OUT_OF_RESOURCES),
        ("radserve.store.files.UploadTooLargeError", OUT_OF_RESOURCES),
        ("radserve.errors.UnsupportedMediaError", CANNOT_UNDERSTAND),
        ("radserve.errors.NotDicomError", CANNOT_UNDERSTAND),
        ("radserve.errors.StudyError", CANNOT_UNDERSTAND),
        ("radserve.errors.EmptyUploadError", CANNOT_UNDERSTAND),
        ("radserve.errors.GeometryError", PROCESSING_FAILURE),
        ("radserve.service.own_uploads.OwnResultsOnlyError", PROCESSING_FAILURE),
        ("radserve.scheduling.errors.ModelUnavailableError", PROCESSING_FAILURE),
    ],
)
def test_stow_failure_reasons(key: str, reason: int) -> None:
    cls = next(c for c in ERRORS if class_key(c) == key)
    assert lookup(cls).stow == reason


def test_dicom_statuses_of_the_storage_scp() -> None:
    from radserve.gateway.errors import InstanceRejectedError, OutOfResourcesError

    assert lookup(OutOfResourcesError("disk full")).dicom == OUT_OF_RESOURCES
    assert lookup(InstanceRejectedError("bad uid")).dicom == CANNOT_UNDERSTAND


def test_the_http_edge_reads_the_table() -> None:
    from radserve.api.errors import status_for
    from radserve.scheduling.errors import DuplicateJobError

    assert status_for(DuplicateJobError("job j1 is already queued")) == 409
    assert error_table.lookup(DuplicateJobError).http == 409


def test_a_code_tells_a_study_s_fault_from_the_server_s() -> None:
    """A failed job keeps only its code; the canary guardrail reads the study's fault from
    it (radserve.errors.is_study_fault). A code shared by a study error and a server-side
    error would blame a model for a broken file, or a file for a broken model."""
    # refusals at the edge of the same input faults, never a job's code: one code on purpose
    sender_s_fault = {
        "instance_invalid": "radserve.gateway.errors.InstanceRejectedError",
        "upload_too_large": "radserve.spool.TooManyPartsOnDiskError",
    }
    study = {c.code for c in ERRORS if issubclass(c, StudyError) and not c.depends_on_model}
    others = [
        c for c in (RadserveError, *ERRORS) if not issubclass(c, StudyError) or c.depends_on_model
    ]
    shared = {class_key(c): c.code for c in others if c.code in study}
    assert shared == {key: code for code, key in sender_s_fault.items()}
    assert {"not_dicom", "decode_failed", "geometry_invalid", "several_studies"} <= study
    # found when the results are written, but the source's (session 33; was report_failed)
    assert {"source_frames_unsupported", "source_value_too_long"} <= study
    assert all(is_study_fault(code) for code in study)
    assert not any(is_study_fault(c.code) for c in others if c.code not in sender_s_fault)
    assert not is_study_fault(None) and not is_study_fault("job_timeout")
    # refused for what one version asks (its input domain, a PET channel): may be its fault
    refused_by_model = {"outside_input_domain", "channel_series_unavailable", "suv_unavailable"}
    assert refused_by_model <= {c.code for c in others}
