"""Result generations: a re-run of a study supersedes its earlier result.

A study is run again when it changed — its second half arrived after the quiet period,
or it was cut off by a crash and completed later. Each job that writes a result for a
study claims the next *generation* for (Study Instance UID, pipeline, scope) in the
store (:class:`~radserve.store.results.LineageIndex`), before its DICOM results are
written, and the report gets a :class:`~radserve.report.schema.Lineage`:

- the previous generation's job and its SR (the new SR's Predecessor Documents
  Sequence; the FHIR DiagnosticReport keeps its identifier, ``Lineage.report_uid``, and
  becomes ``amended``);
- a tracking UID per organ (derived from the study, the same in every generation) and
  per lesion: a lesion matching one of the previous result (same finding type, centroid
  closer than ``max(10 mm, either long axis)``, nearest pairs first) keeps that lesion's
  tracking UID; a new lesion gets one derived from the study, generation and number.

The *scope* is the group of submitters who see each other's jobs under
``security.visibility`` (:meth:`radserve.security.access.ReadAccess.group_of`): with a
rule, site B's run of a study site A ran starts B's own lineage (no predecessor, its own
tracking UIDs and DiagnosticReport identifier), and B's re-runs supersede B's result
only. Without a rule the scope is ``''`` and every UID is the one derived before scopes
existed.

The updated report is written back to ``report.json`` before anything else reads it, so
SEG, SR, SC, FHIR and the API all see the same lineage. A job resumed after a crash
keeps the generation it claimed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from pathlib import Path

from pydicom.uid import generate_uid

from radserve.domain import Finding
from radserve.errors import RadserveError
from radserve.gateway.outbox import utc_now
from radserve.pipeline.study import StudyResult
from radserve.report.dicom import common
from radserve.report.json_report import read_report, write_report
from radserve.report.schema import Lineage, Report, ResultRef
from radserve.store import DatabaseUnavailableError, JobState, Store
from radserve.store.results import LineageIndex, LineageRecord, ResultIndex

logger = logging.getLogger(__name__)

SR_CLASSES = ("1.2.840.10008.5.1.4.1.1.88.34", "1.2.840.10008.5.1.4.1.1.88.33")
MATCH_MIN_MM = 10.0


def _uid(*parts: str) -> str:
    return str(generate_uid(entropy_srcs=list(parts)))


def lineage_uid(study: str, pipeline: str, scope: str, *parts: str) -> str:
    """A UID of the lineage of (study, pipeline, scope): the same in every generation.
    The scope joins the entropy only when set, so without a visibility rule the UIDs are
    those of the lineage before scopes existed (a PACS and a FHIR server keep them)."""
    return _uid(study, pipeline, *(("scope", scope) if scope else ()), *parts)


def diagnostic_report_uid(study: str, pipeline: str, scope: str = "") -> str:
    """The identifier of the lineage's FHIR DiagnosticReport (every generation amends it;
    a failure notice cancels it)."""
    return lineage_uid(study, pipeline, scope, "fhir-diagnostic-report")


def match_findings(current: list[Finding], previous: list[Finding]) -> dict[int, int]:
    """finding_id of ``current`` -> finding_id of the same lesion in ``previous``: same
    finding type, centroid closer than ``max(10 mm, either long axis)``; nearest first,
    each lesion matched at most once."""
    pairs = []
    for cur in current:
        for prev in previous:
            if (cur.concept.scheme, cur.concept.value) != (prev.concept.scheme, prev.concept.value):
                continue
            distance = math.dist(cur.centroid_mm, prev.centroid_mm)
            limit = max(MATCH_MIN_MM, cur.longest_diameter_mm, prev.longest_diameter_mm)
            if distance <= limit:
                pairs.append((distance, cur.finding_id, prev.finding_id))
    matched: dict[int, int] = {}
    taken: set[int] = set()
    for _, cur_id, prev_id in sorted(pairs):
        if cur_id not in matched and prev_id not in taken:
            matched[cur_id] = prev_id
            taken.add(prev_id)
    return matched


def tracking_uids(
    report: Report, generation: int, previous: Report | None, *, scope: str = ""
) -> dict[str, str]:
    """The tracking UID of every organ and lesion of ``report`` in the lineage of
    ``scope`` (see the module doc)."""
    study = report.study.study_instance_uid or ""
    pipeline = report.pipeline.name
    uids = {
        key: lineage_uid(study, pipeline, scope, "tracking", key)
        for key in (common.organ_key(o.model, o.label_value) for o in report.organ_measurements)
    }
    matched = match_findings(report.findings, previous.findings) if previous else {}
    for finding in report.findings:
        key = common.finding_key(finding.finding_id)
        if previous is not None and finding.finding_id in matched:
            # the UID the previous result's SEG/SR carried for that lesion
            uids[key] = common.tracking_uid(
                previous, common.finding_key(matched[finding.finding_id])
            )
        else:
            uids[key] = lineage_uid(
                study, pipeline, scope, "tracking", "lesion", str(generation), key
            )
    return uids


class ResultLineage:
    """Claims generations and writes the lineage into a job's report. ``group_of``: the
    lineage scope of a job's submitter (its API key id or ``user:<name>``; None: the
    gateway), :meth:`radserve.security.access.ReadAccess.group_of`; without it every
    job is in one scope per study (no visibility rule)."""

    def __init__(
        self,
        store: Store,
        results: ResultIndex,
        *,
        group_of: Callable[[str | None], str] | None = None,
    ) -> None:
        self.store = store
        self.results = results
        self.index = LineageIndex(store.engine)
        self.group_of = group_of

    def assign(self, job_id: str, result: StudyResult) -> StudyResult:
        """``result`` with its report's lineage set (and ``report.json`` rewritten)."""
        report = result.report
        study = report.study.study_instance_uid
        if not study:  # a NIfTI upload: no study to supersede anything in
            return result
        pipeline = report.pipeline.name
        scope = self._scope(job_id)
        record = self.index.claim(job_id, study, pipeline, now=utc_now(), scope=scope)
        previous_job, previous = self._predecessor(record)
        lineage = Lineage(
            generation=record.generation,
            supersedes_job_id=previous_job,
            predecessor_sr=self._predecessor_sr(previous_job) if previous_job else None,
            tracking_uids=tracking_uids(report, record.generation, previous, scope=record.scope),
            report_uid=diagnostic_report_uid(study, pipeline, record.scope),
        )
        updated = report.model_copy(update={"lineage": lineage})
        write_report(updated, result.report_path)
        if record.generation > 1:
            logger.info(
                "job %s: result generation %d for its study supersedes job %s",
                job_id,
                record.generation,
                previous_job or "-",
            )
        return dataclasses.replace(result, report=updated)

    def _scope(self, job_id: str) -> str:
        """The lineage scope of the job's submitter ('' without a rule). A job that
        claimed its generation before keeps the scope it claimed it in (LineageIndex)."""
        if self.group_of is None:
            return ""
        return self.group_of(self.store.get_job(job_id).api_key_id)

    def _predecessor(self, record: LineageRecord) -> tuple[str | None, Report | None]:
        """The newest earlier generation with a recorded result, and its report."""
        for earlier in self.index.earlier(record):
            try:
                job = self.store.get_job(earlier.job_id)
            except DatabaseUnavailableError:  # not "no predecessor": the step is retried
                raise
            except RadserveError:
                continue
            if job.state is not JobState.SUCCEEDED or not job.result_path:
                continue
            try:
                return job.id, read_report(Path(job.result_path) / "report.json")
            except (RadserveError, OSError) as exc:
                logger.warning("job %s: its report cannot be read (%s)", job.id, exc)
                return job.id, None
        return None, None

    def _predecessor_sr(self, job_id: str) -> ResultRef | None:
        for item in self.results.of_job(job_id):
            if item.sop_class_uid in SR_CLASSES:
                return ResultRef(
                    study_instance_uid=item.study_instance_uid,
                    series_instance_uid=item.series_instance_uid,
                    sop_class_uid=item.sop_class_uid,
                    sop_instance_uid=item.sop_instance_uid,
                )
        return None


__all__ = [
    "ResultLineage",
    "diagnostic_report_uid",
    "lineage_uid",
    "match_findings",
    "tracking_uids",
]
