"""Warnings learnt about a job's input outside its run, carried into its report.

The gateway knows things about a study that the pipeline cannot see: its transfer was
cut off and never resumed (known at submission), or more of its instances arrived after
the job was created (policy ``flag``: no re-run). They are recorded on the job
(``queue_meta["warnings"]``, :meth:`Store.add_job_warning`) and shown by the API (job
JSON ``warnings``). :class:`JobWarnings` is a step of the result stage: right after the
result's lineage, before any DICOM result or FHIR Bundle is made from the report, it
copies the job's warnings into ``report.json``, so JSON, SR and FHIR all carry them. A
warning recorded after that step (the job was past it, or finished) stays on the job
only: a recorded result's files are never rewritten (their SHA-256 is audited).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from radserve.pipeline.study import StudyResult
from radserve.report.json_report import write_report
from radserve.report.schema import ReportWarning
from radserve.store import JobRecord, Store

logger = logging.getLogger(__name__)

ResultStep = Callable[[str, StudyResult], StudyResult]
GATEWAY_STAGE = "gateway"


def warning(code: str, message: str) -> dict[str, str]:
    """A job warning as stored (and as :class:`ReportWarning` fields)."""
    return {"code": code, "message": message, "stage": GATEWAY_STAGE}


def job_warnings(job: JobRecord) -> list[ReportWarning]:
    """The warnings recorded on ``job`` (malformed entries are skipped)."""
    out = []
    for item in job.queue_meta.get("warnings") or []:
        try:
            out.append(ReportWarning.model_validate(item))
        except ValueError:
            logger.warning("job %s: a recorded warning is malformed; skipped", job.id)
    return out


class JobWarnings:
    """The result step that copies a job's recorded warnings into its report."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def apply(self, job_id: str, result: StudyResult) -> StudyResult:
        extra = job_warnings(self.store.get_job(job_id))
        if not extra:
            return result
        codes = {w.code for w in extra}
        report = result.report
        warnings = [w for w in report.warnings if w.code not in codes] + extra
        updated = report.model_copy(update={"warnings": warnings})
        write_report(updated, result.report_path)
        logger.info("job %s: %d gateway warning(s) added to its report", job_id, len(extra))
        return dataclasses.replace(result, report=updated)


def chain(*steps: ResultStep) -> ResultStep:
    """One result step running ``steps`` in order."""

    def run(job_id: str, result: StudyResult) -> StudyResult:
        for step in steps:
            result = step(job_id, result)
        return result

    return run


__all__ = ["JobWarnings", "chain", "job_warnings", "warning"]
