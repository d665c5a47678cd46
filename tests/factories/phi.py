"""Plant a patient-name marker in every text element of DICOM files (privacy tests).

Every element whose VR holds text (PN, LO, SH, UI, DA, CS, ...), in the dataset, its
sequences and the file meta, gets ``ZQXPHI^Doe`` (SOP Instance UIDs get a per-file
suffix so the instances stay distinct). ``keep`` names the attributes left alone so a
study can still be processed; with ``keep=()`` every text element is planted.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import pydicom

MARKER = "ZQXPHI"
VALUE = f"{MARKER}^Doe"
# numeric strings (DS, IS) cannot hold a name; AT/binary VRs hold no text
TEXT_VRS = frozenset(
    {"AE", "AS", "CS", "DA", "DT", "LO", "LT", "PN", "SH", "ST", "TM", "UC", "UI", "UR", "UT"}
)
# what a pipeline needs to read and run a CT study
PROCESSABLE = (
    "Modality",
    "PhotometricInterpretation",
    "ImageType",
    "SOPClassUID",
    "MediaStorageSOPClassUID",
    "TransferSyntaxUID",
    "SpecificCharacterSet",
)
# what the DICOM gateway needs besides: it refuses instances whose UIDs are not UIDs
UIDS = ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "FrameOfReferenceUID",
        "MediaStorageSOPInstanceUID")  # fmt: skip
_PER_FILE = {"SOPInstanceUID", "MediaStorageSOPInstanceUID"}


def plant(paths: Sequence[Path], keep: Iterable[str] = ("TransferSyntaxUID",)) -> int:
    """Write the marker into every text element of every file; the count planted."""
    keep = set(keep) | {"TransferSyntaxUID"}  # the file must stay readable
    planted = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom warns that the values are invalid
        for index, path in enumerate(paths):
            ds = pydicom.dcmread(path)
            for elem in [*ds.file_meta.iterall(), *ds.iterall()]:
                if elem.VR not in TEXT_VRS or elem.keyword in keep:
                    continue
                elem.value = f"{VALUE}{index}" if elem.keyword in _PER_FILE else VALUE
                planted += 1
            ds.save_as(path)
    return planted


def leaks(text: str) -> list[str]:
    """Lines of ``text`` that carry the marker."""
    return [line for line in text.splitlines() if MARKER in line]
