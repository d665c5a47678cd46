"""DICOMweb WADO-RS over radserve's own results: the DICOM SEG and SR a job wrote (and
its Secondary Capture key images when those are on), found through the result index by
study, series and SOP Instance UID.

Only result instances are served: the studies radserve received are inputs, kept for
processing, not a PACS archive. Instances are served as stored (Explicit VR Little
Endian, as the report stage wrote them); metadata is pydicom's
``to_json_dict`` of each header (PS3.18 F.2, DICOM JSON), without Pixel Data.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radserve.errors import RadserveError
from radserve.ingest.headers import read_header
from radserve.store.results import ResultIndex, ResultInstanceRecord

logger = logging.getLogger(__name__)


class DicomObjectNotFoundError(RadserveError):
    """No result instance has these UIDs (unknown, or not produced by radserve)."""

    code = "not_found"


@dataclass(frozen=True)
class ResultFile:
    path: Path
    sop_instance_uid: str
    transfer_syntax_uid: str


class WadoAccess:
    """Look-ups for the WADO-RS routes; synchronous (call from a worker thread)."""

    def __init__(self, index: ResultIndex) -> None:
        self.index = index

    def find(
        self, study: str, series: str | None = None, instance: str | None = None
    ) -> list[ResultInstanceRecord]:
        """The indexed result instances at a study, series or instance level (the
        reader's visibility is applied to them by radserve.api.auth.audited_results)."""
        return self.index.find(study, series, instance)

    def files(self, records: Sequence[ResultInstanceRecord], level: str) -> list[ResultFile]:
        """The files of ``records`` (of :meth:`find`, at ``level``: study, series or
        instance) still on disk; raises :class:`DicomObjectNotFoundError` when none is."""
        found = [
            ResultFile(Path(r.path), r.sop_instance_uid, r.transfer_syntax_uid)
            for r in records
            if _present(r)
        ]
        if not found:
            raise DicomObjectNotFoundError(
                f"no radserve result {level} with these UIDs; WADO-RS serves the DICOM SEG, "
                "SR and key-image SC radserve wrote (received studies are not served)"
            )
        return found

    def metadata(self, records: Sequence[ResultInstanceRecord], level: str) -> list[dict[str, Any]]:
        """DICOM JSON of each instance's header (no Pixel Data), of :meth:`files`."""
        return [
            read_header(f.path, transfer_syntax=f.transfer_syntax_uid or None).to_json_dict()
            for f in self.files(records, level)
        ]


def _present(record: ResultInstanceRecord) -> bool:
    if Path(record.path).is_file():
        return True
    logger.warning("result instance %s is indexed but its file is gone", record.sop_instance_uid)
    return False


__all__ = ["DicomObjectNotFoundError", "ResultFile", "WadoAccess"]
