"""Tables (SQLAlchemy 2 typed declarative). The migrations create exactly these.

A test compares these classes with the schema the migrations build, so the two cannot
drift apart. States and classes are strings with CHECK constraints rather than native
enums: adding a value is then a one-line migration on both SQLite and PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from radserve.store.db import UtcDateTime

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JOB_STATES = ("received", "queued", "running", "succeeded", "failed", "cancelled")
PRIORITY_CLASSES = ("URGENT", "INPATIENT", "OUTPATIENT")
ROLES = ("read", "submit", "admin")
GENESIS_HASH = "0" * 64
# the longest accession number the worklist's search box takes (DICOM's SH allows 16);
# the number on the job row is kept whole, as the header has it (a non-conformant
# sender's 10,000 characters included: the worklist shows all of it)
ACCESSION_SEARCH_LENGTH = 1024


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_in("state", JOB_STATES), name="state"),
        CheckConstraint(_in("priority_class", PRIORITY_CLASSES), name="priority_class"),
        CheckConstraint("attempts >= 0", name="attempts"),
        Index("ix_jobs_arrival_id", "arrival", "id"),
        # GET /v1/jobs?accession= (equality); hash on PostgreSQL, as the number is kept
        # whole and a B-tree entry over ~2,700 bytes fails the insert (revision 0021)
        Index("ix_jobs_accession", "accession", postgresql_using="hash"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    priority_class: Mapped[str] = mapped_column(String(16))
    arrival: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    deadline: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    started: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    finished: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    updated: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    pipeline_name: Mapped[str] = mapped_column(String(128), index=True)
    pipeline_version: Mapped[str] = mapped_column(String(64))
    precision: Mapped[str] = mapped_column(String(8))
    model_versions: Mapped[dict[str, str]] = mapped_column(JSON)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    study_path: Mapped[str] = mapped_column(Text)
    result_path: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer)
    cached_from: Mapped[str | None] = mapped_column(String(36), ForeignKey("jobs.id"))
    api_key_id: Mapped[str | None] = mapped_column(String(32))
    client_address: Mapped[str | None] = mapped_column(String(128))
    # the study's Accession Number (stripped, whole), which
    # the console's worklist searches in the query; '' the study has none; None not read
    # yet (a job from before revision 0020, until radserve.console.accessions fills it)
    accession: Mapped[str | None] = mapped_column(Text)
    stage_timings: Mapped[dict[str, float]] = mapped_column(JSON)
    queue_meta: Mapped[dict[str, Any]] = mapped_column(JSON)
    # the replica running an unfinished job: "<instance id>/<incarnation>", renewed while
    # it runs; another replica takes the job over only once ``lease_expires`` has passed
    # (``lease_renewed``: when it was last written, so the owner's lease length is known)
    lease_owner: Mapped[str | None] = mapped_column(String(200), index=True)
    lease_expires: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    lease_renewed: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())


class CachedResult(Base):
    """(input, pipeline, models, precision) -> the job whose result answers it."""

    __tablename__ = "results_cache"
    __table_args__ = (
        UniqueConstraint(
            "fingerprint",
            "pipeline_name",
            "pipeline_version",
            "model_versions_key",
            "precision",
            name="uq_results_cache_key",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    pipeline_name: Mapped[str] = mapped_column(String(128))
    pipeline_version: Mapped[str] = mapped_column(String(64))
    model_versions_key: Mapped[str] = mapped_column(Text)
    precision: Mapped[str] = mapped_column(String(8))
    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id"), unique=True)
    created: Mapped[dt.datetime] = mapped_column(UtcDateTime())


class ApiKey(Base):
    __tablename__ = "api_keys"
    __table_args__ = (CheckConstraint(_in("role", ROLES), name="role"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    salt: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    created: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    revoked: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    # scope for security.visibility (own_submitter / site); None: none
    site: Mapped[str | None] = mapped_column(String(128))
    submitter: Mapped[str | None] = mapped_column(String(128))


class AuditEntry(Base):
    """One audit record. ``payload`` is the canonical JSON text the hash was computed on."""

    __tablename__ = "audit_records"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    actor_key_id: Mapped[str | None] = mapped_column(String(32))
    client_address: Mapped[str | None] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64), index=True)
    subject: Mapped[str | None] = mapped_column(String(128), index=True)
    payload: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    # the HMAC key's id (radserve.audit.chain.AuditKey.id); None: an unkeyed sha256 record
    key_id: Mapped[str | None] = mapped_column(String(16))


class AuditHead(Base):
    """The chain's last link, one row: appends lock it, and verify compares it with the
    last record, so deleting the newest records is detected too."""

    __tablename__ = "audit_head"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64))


OUTBOX_STATES = ("pending", "sending", "sent", "failed_permanent", "held", "committing")
OUTBOX_KINDS = ("dicom", "fhir", "critical")


class OutboxDelivery(Base):
    """One result to one destination (the durable outbox): a DICOM instance to a DICOM
    peer (``kind`` dicom), or a FHIR Bundle to a FHIR server (``kind`` fhir).

    Unique per (SOP Instance UID, destination): enqueueing the same result twice adds
    nothing. For a FHIR row ``sop_instance_uid`` holds the Bundle id (the row's identity),
    ``path`` the Bundle's JSON file, and the SOP class and transfer syntax are empty.
    ``attempts`` counts claims, so a send cut short by a crash counts too.
    """

    __tablename__ = "outbox_deliveries"
    __table_args__ = (
        CheckConstraint(_in("state", OUTBOX_STATES), name="state"),
        CheckConstraint(_in("kind", OUTBOX_KINDS), name="kind"),
        CheckConstraint("attempts >= 0", name="attempts"),
        UniqueConstraint(
            "sop_instance_uid", "destination", name="uq_outbox_deliveries_instance_destination"
        ),
        Index("ix_outbox_deliveries_state_due", "state", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(8), server_default="dicom")
    destination: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text)
    sop_class_uid: Mapped[str] = mapped_column(String(64))
    sop_instance_uid: Mapped[str] = mapped_column(String(64))
    study_instance_uid: Mapped[str] = mapped_column(String(64))
    transfer_syntax_uid: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str | None] = mapped_column(String(36), index=True)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    last_error: Mapped[str | None] = mapped_column(Text)
    created: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    updated: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    sent_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime())
    # who holds a ``sending`` row's lease: "<instance id>/<incarnation>", so a restarted
    # server reclaims the rows its previous incarnation left without waiting the lease out
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    # a ``committing`` row's Storage Commitment Transaction UID (N-ACTION), persisted
    # before the request goes out so a report arriving after a restart is matched
    commitment_uid: Mapped[str | None] = mapped_column(String(64), index=True)


class OutboxCommitmentRequest(Base):
    """One outbox row asked of its destination under one Storage Commitment Transaction
    UID (N-ACTION). Kept after the row moves on (sent again under a new transaction,
    rescheduled, failed), so a report arriving after its deadline is still matched to the
    rows it names (radserve.gateway.commitment_ledger)."""

    __tablename__ = "outbox_commitment_requests"

    transaction_uid: Mapped[str] = mapped_column(String(64), primary_key=True)
    delivery_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("outbox_deliveries.id", ondelete="CASCADE"), primary_key=True
    )
    requested_at: Mapped[dt.datetime] = mapped_column(UtcDateTime())


class ResultInstance(Base):
    """A DICOM instance radserve wrote as a job's result (SEG, SR): the index that
    DICOMweb retrieval (WADO-RS) answers from, by study, series and instance UID."""

    __tablename__ = "result_instances"
    __table_args__ = (
        Index("ix_result_instances_study_series", "study_instance_uid", "series_instance_uid"),
    )

    sop_instance_uid: Mapped[str] = mapped_column(String(64), primary_key=True)
    study_instance_uid: Mapped[str] = mapped_column(String(64))
    series_instance_uid: Mapped[str] = mapped_column(String(64))
    sop_class_uid: Mapped[str] = mapped_column(String(64))
    transfer_syntax_uid: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(36), index=True)
    path: Mapped[str] = mapped_column(Text)
    created: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    # what bounds a QIDO-RS search by patient or date (radserve.store.results.PatientKey):
    # the Patient ID only as a keyed hash (HMAC; the key is derived from the audit key and
    # is never in the database), the key's id it was made with, the Study Date (YYYYMMDD)
    patient_key: Mapped[str | None] = mapped_column(String(64), index=True)
    match_key_id: Mapped[str | None] = mapped_column(String(16), index=True)
    study_date: Mapped[str | None] = mapped_column(String(8), index=True)


class ResultLineage(Base):
    """Generations of results per study, pipeline and scope: a job that writes a result
    for a study that already has one in its scope supersedes it (SR Predecessor
    Documents, FHIR amended). ``scope``: the group of submitters who see each other's
    jobs under ``security.visibility`` (radserve.security.access.ReadAccess.group_of);
    ``''`` without a rule."""

    __tablename__ = "result_lineage"
    __table_args__ = (
        UniqueConstraint("study_instance_uid", "pipeline_name", "scope", "generation"),
        Index("ix_result_lineage_study_pipeline", "study_instance_uid", "pipeline_name"),
    )

    job_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    study_instance_uid: Mapped[str] = mapped_column(String(64))
    pipeline_name: Mapped[str] = mapped_column(String(128))
    scope: Mapped[str] = mapped_column(String(200), server_default="")
    generation: Mapped[int] = mapped_column(Integer)
    created: Mapped[dt.datetime] = mapped_column(UtcDateTime())


DEPLOYMENT_ACTIONS = ("deploy", "promote", "rollback", "auto_rollback", "undeploy")


class ModelDeployment(Base):
    """One change of which model versions serve a pipeline step (append-only).

    A row is the step's whole state after the change: the stable version, the canary
    (with its share of routine studies) and the shadow (with its sampled share). The
    step's newest row is what serves; older rows are its history.
    """

    __tablename__ = "model_deployments"
    __table_args__ = (
        CheckConstraint(_in("action", DEPLOYMENT_ACTIONS), name="action"),
        CheckConstraint("canary_percent >= 0 AND canary_percent <= 100", name="canary_percent"),
        CheckConstraint("shadow_percent >= 0 AND shadow_percent <= 100", name="shadow_percent"),
        Index("ix_model_deployments_step_id", "step", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    step: Mapped[str] = mapped_column(String(128))
    stable: Mapped[str] = mapped_column(String(64))
    canary: Mapped[str | None] = mapped_column(String(64))
    canary_percent: Mapped[float] = mapped_column(Float)
    canary_urgent: Mapped[bool] = mapped_column(Boolean)
    shadow: Mapped[str | None] = mapped_column(String(64))
    shadow_percent: Mapped[float] = mapped_column(Float)
    action: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)


class ReplicaDestinations(Base):
    """Each replica's destinations as it configured them (kind:name -> a digest of the
    settings that decide where results go), written at every lease renewal: replicas
    must configure the same destinations (radserve.store.lane_share), and one that reads
    another's different map says so (radserve.store.replica_config)."""

    __tablename__ = "replica_destinations"

    instance: Mapped[str] = mapped_column(String(120), primary_key=True)
    destinations: Mapped[dict[str, str]] = mapped_column(JSON)
    renewed: Mapped[dt.datetime] = mapped_column(UtcDateTime())


class ConsoleSession(Base):
    """A signed-in console browser (radserve.store.console_sessions): keyed by the
    SHA-256 of its session id, never the id; shared by every replica on the database."""

    __tablename__ = "console_sessions"
    __table_args__ = (
        CheckConstraint(_in("role", ROLES), name="role"),
        Index("ix_console_sessions_key_id", "key_id"),
    )

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(64))  # an API key's id, or user:<name>
    key_name: Mapped[str | None] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    site: Mapped[str | None] = mapped_column(String(128))
    submitter: Mapped[str | None] = mapped_column(String(128))
    username: Mapped[str | None] = mapped_column(String(64))  # a local user's session
    user_check: Mapped[str | None] = mapped_column(String(64))  # its account's fingerprint
    csrf: Mapped[str] = mapped_column(String(64))
    created: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    expires: Mapped[dt.datetime] = mapped_column(UtcDateTime())
    last_seen: Mapped[dt.datetime] = mapped_column(UtcDateTime())


class ConsoleSigninFailure(Base):
    """One failed console sign-in from ``client`` (radserve.console.limits), counted by
    every replica; rows older than the window are swept."""

    __tablename__ = "console_signin_failures"
    __table_args__ = (Index("ix_console_signin_failures_client_at", "client", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    client: Mapped[str] = mapped_column(String(64))
    at: Mapped[dt.datetime] = mapped_column(UtcDateTime(), index=True)
