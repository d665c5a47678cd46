"""QIDO-RS searches by Patient ID or Study Date read only the index rows they can match:
the index holds a keyed hash (HMAC, a key derived from the audit key) of the Patient ID,
never the ID, and the Study Date. Bounded searches answer what reading the whole index
answered, rows indexed before the columns (or under another key) included."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid
from sqlalchemy import select
from tests.factories.postgres import store_on

from radserve.audit.chain import AuditKey
from radserve.gateway.dicomweb.index import describe
from radserve.gateway.dicomweb.qido import QidoSearch, parse_query
from radserve.store import Store
from radserve.store.models import ResultInstance
from radserve.store.result_match import MatchBounds, date_bounds
from radserve.store.results import ResultIndex

SEG = "1.2.840.10008.5.1.4.1.1.66.4"
NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)
# (Patient ID, Study Date) of each study; two studies of P-1
STUDIES = (("P-1", "20240115"), ("P-1", "20250620"), ("P-2", "20250620"), ("P-3", ""))


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with store_on(request.param, tmp_path, "radserve_qido_bounded") as opened:
        yield opened


def result_file(folder: Path, patient_id: str, study_date: str) -> Path:
    """A small SEG-like result file with the source study's patient and date."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SEG
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = SEG, meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.PatientID, ds.PatientName, ds.StudyDate = patient_id, "Test^Patient", study_date
    ds.Modality, ds.SeriesNumber, ds.InstanceNumber = "SEG", 1, 1
    path = folder / f"{ds.SOPInstanceUID}.dcm"
    ds.save_as(path, enforce_file_format=True)
    return path


def index_studies(index: ResultIndex, folder: Path) -> None:
    for n, (patient_id, study_date) in enumerate(STUDIES):
        path = result_file(folder, patient_id, study_date)
        index.add([describe(path, f"job-{n}", index.patient_key)], now=NOW)


def studies(search: QidoSearch, **filters: str) -> list[tuple[str, str]]:
    query = parse_query(filters.items(), "study")
    found = search.search(query, "http://radserve/dicomweb").results
    return [(s["00100020"]["Value"][0], s.get("00080020", {}).get("Value", [""])[0]) for s in found]


def test_patient_and_date_searches_read_only_their_rows_and_find_what_a_full_read_does(
    store: Store, tmp_path: Path
) -> None:
    key = AuditKey(secrets.token_bytes(32))
    keyed = ResultIndex(store.engine, audit_key=key)
    index_studies(keyed, tmp_path)
    assert keyed.patient_key is not None
    p1 = keyed.patient_key.of("P-1")
    assert len(keyed.find(None, bounds=MatchBounds(patient_key=p1))) == 2
    in_2025 = MatchBounds(None, *date_bounds("20250101-20251231"))
    assert len(keyed.find(None, bounds=in_2025)) == 3  # P-3 has no date: its header decides
    full = QidoSearch(ResultIndex(store.engine))  # no key: reads the whole index
    bounded = QidoSearch(keyed)
    for filters in (
        {"PatientID": "P-1"},
        {"PatientID": "P-2", "StudyDate": "20250620"},
        {"PatientID": " P-1 "},  # not the ID (LO is matched as sent): nothing, as before
        {"StudyDate": "2025-"},
        {"StudyDate": "-20241231"},
        {"StudyDate": "20250620"},
        {"PatientID": "NOBODY"},
    ):
        assert studies(bounded, **filters) == studies(full, **filters), filters
    assert studies(bounded, PatientID="P-1") == [("P-1", "20250620"), ("P-1", "20240115")]
    with store.engine.connect() as connection:
        held = connection.execute(select(ResultInstance.patient_key)).scalars().all()
    assert not {"P-1", "P-2", "P-3"} & set(held)  # the database holds no Patient ID


def test_rows_indexed_before_the_columns_or_under_another_key_are_filled_in(
    store: Store, tmp_path: Path
) -> None:
    index_studies(ResultIndex(store.engine), tmp_path)  # no key: no match columns
    for _ in range(2):  # then the audit key replaced: the rows are hashed again
        search = QidoSearch(ResultIndex(store.engine, audit_key=AuditKey(secrets.token_bytes(32))))
        assert studies(search, PatientID="P-2") == [("P-2", "20250620")]
        assert studies(search, StudyDate="20240115") == [("P-1", "20240115")]
    late = result_file(tmp_path, "P-2", "20260101")  # indexed by a process without the key
    ResultIndex(store.engine).add([describe(late, "job-late")], now=NOW)
    assert studies(search, PatientID="P-2") == [("P-2", "20260101"), ("P-2", "20250620")]
