"""The index of DICOM result instances (SEG, SR) that DICOMweb retrieval answers from,
and the lineage of results per study (:class:`LineageIndex`).

A row names one instance radserve wrote, by its study, series and SOP Instance UID, and
where the file lies. Rows are added when a job's result is recorded; adding the same
instance again changes nothing, so a job resumed after a crash indexes idempotently.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

from sqlalchemy import exc as sa_exc
from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from radserve.domain.jobs import JobState
from radserve.store.base import StoreBase
from radserve.store.models import Job, ResultInstance, ResultLineage
from radserve.store.result_match import MatchBounds, PatientKey


@dataclass(frozen=True)
class ResultInstanceRecord:
    """One indexed result instance (a frozen copy of its row)."""

    sop_instance_uid: str
    study_instance_uid: str
    series_instance_uid: str
    sop_class_uid: str
    transfer_syntax_uid: str
    job_id: str
    path: str
    # what bounds a QIDO-RS search (radserve.store.result_match): no Patient ID in clear
    patient_key: str | None = None
    match_key_id: str | None = None
    study_date: str | None = None


class ResultIndex(StoreBase):
    """Typed access to ``result_instances``; share the main store's engine and audit key:
    ``ResultIndex(store.engine, audit_key=store.audit_key)`` (without a key no row gets a
    Patient ID hash, and no search is bounded by one). Thread-safe."""

    @functools.cached_property
    def patient_key(self) -> PatientKey | None:
        """The key of the Patient ID hashes (derived from the audit key), or None."""
        return None if self.audit_key is None else PatientKey.from_audit_key(self.audit_key)

    def add(self, records: Sequence[ResultInstanceRecord], *, now: dt.datetime) -> int:
        """Index ``records``; instances indexed already are left as they are. Returns
        how many rows are new."""
        if not records:
            return 0
        added = 0
        with self._write(audited=False) as session:
            dialect = session.get_bind().dialect.name
            insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
            for record in records:
                # RETURNING: rowcount is -1 on PostgreSQL for ON CONFLICT inserts
                inserted = session.execute(
                    insert(ResultInstance)
                    .values(**asdict(record), created=now)
                    .on_conflict_do_nothing()
                    .returning(ResultInstance.sop_instance_uid)
                ).first()
                added += inserted is not None
        return added

    def find(
        self,
        study_instance_uid: str | None,
        series_instance_uid: str | None = None,
        sop_instance_uid: str | None = None,
        *,
        bounds: MatchBounds | None = None,
    ) -> list[ResultInstanceRecord]:
        """The instances of a study (of one series, or one instance), in a stable order;
        every indexed instance when ``study_instance_uid`` is None (QIDO-RS searches),
        or those within ``bounds`` (rows filled in by :meth:`fill_match` before)."""
        query = select(ResultInstance)
        if bounds is not None and bounds.patient_key is not None:
            query = query.where(ResultInstance.patient_key == bounds.patient_key)
        if bounds is not None and (bounds.date_from or bounds.date_to):
            within = ResultInstance.study_date.is_not(None)
            if bounds.date_from:
                within &= ResultInstance.study_date >= bounds.date_from
            if bounds.date_to:
                within &= ResultInstance.study_date <= bounds.date_to
            query = query.where(ResultInstance.study_date.is_(None) | within)
        if study_instance_uid is not None:
            query = query.where(ResultInstance.study_instance_uid == study_instance_uid)
        if series_instance_uid is not None:
            query = query.where(ResultInstance.series_instance_uid == series_instance_uid)
        if sop_instance_uid is not None:
            query = query.where(ResultInstance.sop_instance_uid == sop_instance_uid)
        query = query.order_by(
            ResultInstance.series_instance_uid, ResultInstance.created, ResultInstance.path
        )
        with self._read() as session:
            return [_record(row) for row in session.scalars(query).all()]

    def unmatched(self, key_id: str, *, only_unset: bool = False) -> list[tuple[str, str, str]]:
        """(SOP Instance UID, path, Transfer Syntax UID) of the rows without match columns
        of key ``key_id``: indexed before them, without a key, or under another audit key;
        ``only_unset``: only those without any (an indexed lookup)."""
        unset = ResultInstance.match_key_id.is_(None)
        stale = unset if only_unset else unset | (ResultInstance.match_key_id != key_id)
        with self._read() as session:
            rows = session.execute(
                select(
                    ResultInstance.sop_instance_uid,
                    ResultInstance.path,
                    ResultInstance.transfer_syntax_uid,
                ).where(stale)
            ).all()
            return [(sop, path, syntax) for sop, path, syntax in rows]

    def fill_match(self, rows: Sequence[tuple[str, str | None, str | None]], key_id: str) -> None:
        """Set (SOP Instance UID, patient_key, study_date) of each row, made with ``key_id``."""
        if not rows:
            return
        with self._write(audited=False) as session:
            for sop, patient_key, study_date in rows:
                session.execute(
                    update(ResultInstance)
                    .where(ResultInstance.sop_instance_uid == sop)
                    .values(patient_key=patient_key, study_date=study_date, match_key_id=key_id)
                )

    def contains(self, sop_instance_uid: str) -> bool:
        """Whether radserve wrote (and indexed) the instance with this UID."""
        with self._read() as session:
            found = session.execute(
                select(ResultInstance.sop_instance_uid).where(
                    ResultInstance.sop_instance_uid == sop_instance_uid
                )
            ).first()
            return found is not None

    def of_job(self, job_id: str) -> list[ResultInstanceRecord]:
        with self._read() as session:
            rows = session.scalars(
                select(ResultInstance)
                .where(ResultInstance.job_id == job_id)
                .order_by(ResultInstance.path)
            ).all()
            return [_record(row) for row in rows]


@dataclass(frozen=True)
class LineageRecord:
    """One generation of a study's results (by one pipeline, in one scope), written by
    one job. ``scope``: whose lineage it is under ``security.visibility`` (``''``: no
    rule's; see :class:`radserve.store.models.ResultLineage`)."""

    job_id: str
    study_instance_uid: str
    pipeline_name: str
    generation: int
    scope: str = ""


class LineageIndex(StoreBase):
    """Typed access to ``result_lineage``; share the main store's engine. Thread-safe."""

    def claim(
        self,
        job_id: str,
        study_instance_uid: str,
        pipeline_name: str,
        *,
        now: dt.datetime,
        scope: str = "",
    ) -> LineageRecord:
        """The generation ``job_id`` writes for the study in ``scope``: the next one, or
        the one it claimed before (a job resumed after a crash keeps its generation and
        scope)."""
        for _ in range(5):
            existing = self.of_job(job_id)
            if existing is not None:
                return existing
            try:
                with self._write(audited=False) as session:
                    latest = session.execute(
                        select(func.max(ResultLineage.generation)).where(
                            ResultLineage.study_instance_uid == study_instance_uid,
                            ResultLineage.pipeline_name == pipeline_name,
                            ResultLineage.scope == scope,
                        )
                    ).scalar()
                    session.add(
                        ResultLineage(
                            job_id=job_id,
                            study_instance_uid=study_instance_uid,
                            pipeline_name=pipeline_name,
                            scope=scope,
                            generation=(latest or 0) + 1,
                            created=now,
                        )
                    )
            except sa_exc.IntegrityError:  # another job took that generation: next one
                continue
        existing = self.of_job(job_id)
        if existing is None:
            raise RuntimeError(f"job {job_id}: no result generation could be claimed")
        return existing

    def of_job(self, job_id: str) -> LineageRecord | None:
        with self._read() as session:
            row = session.get(ResultLineage, job_id)
            return _lineage(row) if row is not None else None

    def earlier(self, record: LineageRecord) -> list[LineageRecord]:
        """The study's earlier generations (same pipeline and scope), newest first."""
        with self._read() as session:
            rows = session.scalars(
                select(ResultLineage)
                .where(
                    ResultLineage.study_instance_uid == record.study_instance_uid,
                    ResultLineage.pipeline_name == record.pipeline_name,
                    ResultLineage.scope == record.scope,
                    ResultLineage.generation < record.generation,
                )
                .order_by(ResultLineage.generation.desc())
            ).all()
            return [_lineage(row) for row in rows]

    def latest_succeeded(
        self, study_instance_uid: str, pipeline_name: str, scope: str = ""
    ) -> LineageRecord | None:
        """The study's newest generation (pipeline, scope) whose job succeeded: the result
        the PACS and the FHIR server hold now, which a failed re-run must not cancel."""
        with self._read() as session:
            row = session.scalars(
                select(ResultLineage)
                .join(Job, Job.id == ResultLineage.job_id)
                .where(
                    ResultLineage.study_instance_uid == study_instance_uid,
                    ResultLineage.pipeline_name == pipeline_name,
                    ResultLineage.scope == scope,
                    Job.state == JobState.SUCCEEDED.value,
                )
                .order_by(ResultLineage.generation.desc())
                .limit(1)
            ).first()
            return _lineage(row) if row is not None else None


def _lineage(row: ResultLineage) -> LineageRecord:
    return LineageRecord(
        row.job_id, row.study_instance_uid, row.pipeline_name, row.generation, row.scope
    )


def _record(row: ResultInstance) -> ResultInstanceRecord:
    """The row's columns of the record's fields (the record names them once)."""
    return ResultInstanceRecord(
        **{f.name: getattr(row, f.name) for f in fields(ResultInstanceRecord)}
    )


__all__ = ["LineageIndex", "LineageRecord", "ResultIndex", "ResultInstanceRecord"]
