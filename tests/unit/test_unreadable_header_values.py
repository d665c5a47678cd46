"""A header value pydicom cannot convert (read on first access, so it raises at the
reader, e.g. ``NotImplementedError`` for an unknown VR) is absent to the own-result check
and to the failure-SR builder, as to every intake (``headers.header_text``): it neither
raises nor hides the other values."""

from __future__ import annotations

import datetime as dt

import pytest
from pydicom.dataelem import RawDataElement
from pydicom.dataset import Dataset
from pydicom.tag import Tag
from pydicom.uid import generate_uid

from radserve.errors import ReportError
from radserve.gateway.own_results import OwnResults, own_result_reason
from radserve.report.dicom.common import MANUFACTURER
from radserve.report.dicom.failure import build_failure_sr
from radserve.store import DatabaseUnavailableError


def _unreadable(ds: Dataset, keyword: str) -> Dataset:
    tag = Tag(keyword)
    ds[tag] = RawDataElement(tag, "XX", 4, b"1.23", 0, True, True)  # an unknown VR
    with pytest.raises(NotImplementedError):
        ds.get(keyword)
    return ds


def _header() -> Dataset:
    ds = Dataset()
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.SOPClassUID, ds.SOPInstanceUID = "1.2.840.10008.5.1.4.1.1.2", generate_uid()
    ds.PatientID = "P1"
    return ds


def test_an_unreadable_uid_does_not_hide_radserve_as_manufacturer():
    ds = _unreadable(_header(), "SOPInstanceUID")
    ds.Manufacturer = MANUFACTURER
    assert own_result_reason(ds, known=lambda uid: False) == "Manufacturer is radserve"
    assert OwnResults(known=lambda uid: False).check(ds, "C-STORE")


def test_an_unreadable_manufacturer_is_not_radserve():
    ds = _unreadable(_header(), "Manufacturer")
    assert own_result_reason(ds, known=lambda uid: False) is None


def test_a_result_index_that_cannot_be_asked_is_not_evidence():
    """During a database outage the index lookup raises: the submission must go on (it
    waits for the database where it needs it) and the Manufacturer check still applies."""

    def outage(uid: str) -> bool:
        raise DatabaseUnavailableError("database unavailable: connection refused")

    ds = _header()
    assert own_result_reason(ds, known=outage) is None
    ds.Manufacturer = MANUFACTURER
    assert own_result_reason(ds, known=outage) == "Manufacturer is radserve"


def test_the_failure_sr_leaves_out_unreadable_values():
    ds = _unreadable(_unreadable(_header(), "Modality"), "PatientName")
    sr = build_failure_sr(
        [ds], job_id="j1", error_code="E", reason="r", when=dt.datetime.now(dt.UTC)
    )
    assert sr.StudyInstanceUID == ds.StudyInstanceUID
    assert sr.PatientID == "P1"
    assert "PatientName" not in sr or not sr.PatientName


def test_the_failure_sr_refuses_headers_whose_uids_are_unreadable():
    ds = _unreadable(_header(), "StudyInstanceUID")
    with pytest.raises(ReportError, match="UIDs"):
        build_failure_sr(
            [ds], job_id="j1", error_code="E", reason="r", when=dt.datetime.now(dt.UTC)
        )


def test_the_failure_sr_of_an_unknown_sop_class_is_a_report_error():
    """Found by the instance fuzz target: highdicom's KeyError for a SOP Class UID it
    has no IOD for escaped build_failure_sr."""
    ds = _header()
    ds.SOPClassUID = "1.2.840.10008.51..4.1.1.2.1"
    with pytest.raises(ReportError, match="could not be built"):
        build_failure_sr(
            [ds], job_id="j1", error_code="E", reason="r", when=dt.datetime.now(dt.UTC)
        )
