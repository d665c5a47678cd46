"""Accession number and patient fields of a job's stored study, for the console.

Read from one DICOM file's header of the stored study (``stop_before_pixels``, only the
needed tags) and kept in a bounded memory cache by job id: the worklist searches by
accession without opening every study each time. Patient fields leave this module only
for roles in ``console.phi_roles`` (see :mod:`radserve.console.routes`) and are never
logged (``PatientFields`` has a redacted ``repr``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import pydicom
from pydicom.errors import InvalidDicomError

_TAGS = ["AccessionNumber", "PatientName", "PatientID", "PatientBirthDate", "PatientSex"]
_CAPACITY = 50_000


@dataclass(frozen=True)
class PatientFields:
    accession: str = ""
    name: str = field(default="", repr=False)
    patient_id: str = field(default="", repr=False)
    birth_date: str = field(default="", repr=False)
    sex: str = field(default="", repr=False)


def read_fields(study_path: str | Path) -> PatientFields:
    """The fields from the first readable DICOM file in the study folder (empty for a
    NIfTI upload or an unreadable folder)."""
    folder = Path(study_path)
    try:
        files = sorted(p for p in folder.iterdir() if p.is_file())
    except OSError:
        return PatientFields()
    for path in files[:20]:
        try:
            ds = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=_TAGS)
        except (InvalidDicomError, OSError, ValueError, EOFError):
            continue
        return PatientFields(
            accession=str(ds.get("AccessionNumber", "") or ""),
            name=str(ds.get("PatientName", "") or ""),
            patient_id=str(ds.get("PatientID", "") or ""),
            birth_date=str(ds.get("PatientBirthDate", "") or ""),
            sex=str(ds.get("PatientSex", "") or ""),
        )
    return PatientFields()


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
