"""The access log keeps a request's route and ids, not what a client typed in the path:
``GET /v1/jobs/ZZPID123`` (a patient ID where a job id goes) was logged in clear."""

from __future__ import annotations

import logging

import pytest

from radserve.security.logs import ACCESS_LOGGER, RedactingFilter


def _logged(path: str) -> str:
    record = logging.LogRecord(
        ACCESS_LOGGER, logging.INFO, "h2", 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", path, "1.1", 404), None,
    )  # fmt: skip
    assert RedactingFilter().filter(record)
    return record.getMessage()


@pytest.mark.parametrize(
    ("path", "logged"),
    [
        ("/v1/jobs/ZZPID123", "/v1/jobs/<redacted>"),
        ("/v1/jobs/SMITH%5EJOHN/report", "/v1/jobs/<redacted>/report"),
        ("/v1/jobs/SMITH^JOHN", "/v1/jobs/<redacted>"),
        ("/dicomweb/19010203", "/dicomweb/<redacted>"),
        ("/dicomweb/1901.02.03", "/dicomweb/<redacted>"),
        ("/v1/jobs/0b5c7e8e-1d2f-4a3b-9c8d-7e6f5a4b3c2d/fhir", None),
        ("/dicomweb/studies/1.2.840.113619.2.55.3/series/2.25.1234", None),
        ("/v1/models/organs/1.0.0/deploy", None),
        ("/assets/index-D3f9aB12.js", None),
        ("/dicomweb/studies?PatientID=ZZPID123", "/dicomweb/studies?PatientID=<redacted>"),
    ],
)
def test_a_path_keeps_routes_and_ids_and_loses_what_may_be_a_patient(
    path: str, logged: str | None
) -> None:
    assert f"GET {logged or path} HTTP/1.1" in _logged(path)
