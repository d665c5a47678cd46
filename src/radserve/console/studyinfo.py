"""Accession number and patient fields of a job's stored study, for the console.

Read from one DICOM file's (or zip member's) header of the stored study (only the needed
tags, within the ingest bounds: :mod:`radserve.ingest.stored`) and kept in a bounded
memory cache by job id: the worklist searches by accession without opening every study
each time. Patient fields leave this module only
for roles in ``console.phi_roles`` (see :mod:`radserve.console.routes`) and are never
logged (``PatientFields`` has a redacted ``repr``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from radserve.ingest.headers import header_text
from radserve.ingest.stored import first_stored_header

_TAGS = (
    "SpecificCharacterSet",
    "AccessionNumber",
    "PatientName",
    "PatientID",
    "PatientBirthDate",
    "PatientSex",
)
_CAPACITY = 50_000


@dataclass(frozen=True)
class PatientFields:
    accession: str = ""
    name: str = field(default="", repr=False)
    patient_id: str = field(default="", repr=False)
    birth_date: str = field(default="", repr=False)
    sex: str = field(default="", repr=False)


def read_fields(study_path: str | Path) -> PatientFields:
    """The fields from the first readable DICOM file or zip member of the stored study
    (empty for a NIfTI upload or an unreadable folder; before session 35 a study uploaded
    as one zip had none either, and accession search could not find it)."""
    ds = first_stored_header(study_path, _TAGS)
    if ds is None:
        return PatientFields()
    # several values shown as DICOM writes them (A\\B), not as Python's list text
    return PatientFields(
        accession=header_text(ds, "AccessionNumber"),
        name=header_text(ds, "PatientName"),
        patient_id=header_text(ds, "PatientID"),
        birth_date=header_text(ds, "PatientBirthDate"),
        sex=header_text(ds, "PatientSex"),
    )


class StudyInfo:
    """Job id -> :class:`PatientFields`, read once per job."""

    def __init__(self, capacity: int = _CAPACITY) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, PatientFields] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job_id: str, study_path: str) -> PatientFields:
        with self._lock:
            hit = self._items.get(job_id)
            if hit is not None:
                self._items.move_to_end(job_id)
                return hit
        fields = read_fields(study_path)
        with self._lock:
            self._items[job_id] = fields
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return fields


__all__ = ["PatientFields", "StudyInfo", "read_fields"]
