"""Header elements of a study as radserve stored it: its DICOM files, and the members of
its zip archives (a zip uploaded over REST is stored as it came).

Read as ingest reads the study, since the study may be the hostile input that made its
job fail: archives listed by :func:`expand_sources` under the same bounds, members opened
by :class:`SourceReader`, each header read within the policy's header bounds; what is not
DICOM, damaged or over a bound is skipped. The failure notices and the console's patient
fields read here; before session 35 both read only plain files, so a study uploaded as
one zip had no failure notice and no patient fields in the console.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import BinaryIO

import pydicom

from radserve.ingest.headers import header_text, read_header
from radserve.ingest.policy import IngestPolicy
from radserve.ingest.sources import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    ArchiveRejectedError,
    SourceReader,
    expand_sources,
)


def stored_headers(
    study_path: Path | str, tags: Sequence[str], policy: IngestPolicy | None = None
) -> Iterator[pydicom.Dataset]:
    """The elements ``tags`` of each readable DICOM file or zip member of a stored study."""
    folder = Path(study_path)
    if not folder.is_dir():
        return
    policy = policy or IngestPolicy()
    max_archive = min(DEFAULT_MAX_ARCHIVE_BYTES, policy.max_study_bytes)

    def header(source: str | Path | BinaryIO) -> pydicom.Dataset:
        return read_header(
            source,
            tags=list(tags),
            max_header_bytes=policy.max_header_bytes,
            max_header_elements=policy.max_header_elements,
        )

    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:  # one file at a time: an archive over the bounds hides only itself
            sources, _ = expand_sources(
                path,
                max_archive_bytes=max_archive,
                max_archive_members=policy.max_archive_members,
            )
        except ArchiveRejectedError:
            continue
        with SourceReader() as reader:
            for src in sources:
                try:
                    if src.member is None:
                        found = header(src.path)
                    else:
                        with reader.open(src) as member:
                            found = header(member)
                except Exception:  # not DICOM (NIfTI, garbage) or damaged: the next one
                    continue
                yield found


def first_stored_header(
    study_path: Path | str, tags: Sequence[str], policy: IngestPolicy | None = None
) -> pydicom.Dataset | None:
    """The elements ``tags`` of the first readable DICOM file or zip member, or None."""
    with closing(stored_headers(study_path, tags, policy)) as headers:
        return next(headers, None)


def stored_accession(study_path: Path | str, policy: IngestPolicy | None = None) -> str:
    """The Accession Number of the first readable DICOM file or zip member, stripped,
    several values joined by backslashes as DICOM writes them ('' for a NIfTI upload, a
    study without one, or an unreadable folder; before session 42 several values were
    stored as Python's list text, ``['A1', 'A2']``, which no search for A1 found)."""
    ds = first_stored_header(study_path, ("SpecificCharacterSet", "AccessionNumber"), policy)
    return header_text(ds, "AccessionNumber") if ds is not None else ""


__all__ = ["first_stored_header", "stored_accession", "stored_headers"]
