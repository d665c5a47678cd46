"""A job's DICOM results (SEG, SR) -> the result index that DICOMweb retrieval reads.

Indexed when the job's result is recorded, from the files' own headers (pydicom reads
only the header), so WADO-RS finds them by study, series and SOP Instance UID, and
QIDO-RS narrows a search by patient (a keyed hash of the Patient ID) or Study Date
(:mod:`radserve.store.result_match`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from radserve.gateway.outbox import utc_now
from radserve.ingest.headers import UnreadableHeaderError, read_header
from radserve.pipeline.study import StudyResult
from radserve.store import JobRecord
from radserve.store.result_match import PatientKey, match_columns
from radserve.store.results import ResultIndex, ResultInstanceRecord

logger = logging.getLogger(__name__)


def describe(path: Path, job_id: str, key: PatientKey | None = None) -> ResultInstanceRecord:
    """The index row of one result file (its header's UIDs; with ``key``, the keyed hash
    of its Patient ID and its Study Date)."""
    header = read_header(path)
    patient_key, study_date = match_columns(header, key)
    return ResultInstanceRecord(
        sop_instance_uid=str(header.SOPInstanceUID),
        study_instance_uid=str(header.StudyInstanceUID),
        series_instance_uid=str(header.SeriesInstanceUID),
        sop_class_uid=str(header.SOPClassUID),
        transfer_syntax_uid=str(header.file_meta.TransferSyntaxUID),
        job_id=job_id,
        path=str(Path(path).absolute()),
        patient_key=patient_key,
        match_key_id=key.id if key is not None else None,
        study_date=study_date,
    )


class ResultIndexer:
    """Index the ``*.dcm`` files of each recorded result (called from the job hooks)."""

    def __init__(self, index: ResultIndex) -> None:
        self.index = index

    def on_result(self, job: JobRecord, result: StudyResult) -> None:
        records = []
        for path in sorted(Path(result.out_dir).glob("*.dcm")):
            try:
                records.append(describe(path, job.id, self.index.patient_key))
            except (OSError, UnreadableHeaderError, AttributeError) as exc:
                logger.error("job %s: result %s not indexed (%s)", job.id, path.name, exc)
        added = self.index.add(records, now=utc_now())
        if records:
            logger.info("job %s: %d DICOM result(s) indexed (%d new)", job.id, len(records), added)


__all__ = ["ResultIndexer", "describe"]
