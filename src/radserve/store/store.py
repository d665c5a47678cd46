"""The :class:`Store` facade: jobs, the result cache, API keys and the audit chain.

Every method is one transaction and returns frozen records. A mutating call commits
before it returns, so "the job row is committed before the API answers 202" holds by
construction. State changes are conditional UPDATEs (``WHERE state IN (allowed)``),
which makes them atomic on both backends: of two workers claiming one job, exactly
one wins and the other gets :class:`InvalidTransitionError`.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, cast

from sqlalchemy import CursorResult, Update, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from radserve.audit.chain import AuditKey
from radserve.audit.events import Action, job_event
from radserve.domain.priority import PriorityClass
from radserve.errors import quoted
from radserve.store import audit as audit_log
from radserve.store import jobs as jobq
from radserve.store.access import AccessMixin
from radserve.store.base import AuditListener
from radserve.store.console import ConsoleMixin
from radserve.store.db import make_engine, sqlite_file, wal_pending
from radserve.store.db_clock import database_time
from radserve.store.errors import (
    InvalidTransitionError,
    JobExistsError,
    JobNotFoundError,
    ResultAlreadyRecordedError,
    SchemaNotCurrentError,
    StoreError,
)
from radserve.store.jobs import UNFINISHED_STATES
from radserve.store.joins import JoinMixin, JoinRule, answer, lock_input
from radserve.store.leases import HELD, Lease, LeaseLostError, LeaseMixin
from radserve.store.migrate import require_head, upgrade
from radserve.store.misses import MissMixin
from radserve.store.models import CachedResult, Job, OutboxDelivery
from radserve.store.records import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    CacheKey,
    JobPage,
    JobRecord,
    JobState,
    utc_now,
)
from radserve.store.relocate import RelocateMixin
from radserve.store.replica_config import ReplicaConfigMixin

logger = logging.getLogger(__name__)

_AUDITED_STATES = {
    JobState.RUNNING: Action.JOB_STARTED,  # each attempt, so a re-run after a crash shows
    JobState.FAILED: Action.JOB_FAILED,
    JobState.CANCELLED: Action.JOB_CANCELLED,
}


def init_store(
    url: str,
    *,
    audit_key: AuditKey | None = None,
    on_audit: AuditListener | None = None,
    schema: Literal["upgrade", "create", "current"] = "upgrade",
) -> Store:
    """Open the database at ``url``, creating or upgrading its schema to the latest version
    (``schema="create"``, a writing command other than serve: create it on an empty
    database, refuse an older or newer one with :class:`SchemaNotCurrentError`;
    ``"current"``, a command that only reads: refuse any other revision, change nothing).

    ``audit_key`` keys the audit chain's hashes (every writer of a keyed chain needs it:
    see :func:`radserve.audit.seal.open_store`); ``on_audit`` is told of every appended
    record after its transaction commits.

    A SQLite store in a folder this process cannot write (read-only media) is opened
    read-only for ``"current"`` (:func:`radserve.store.db.make_engine`); a store that
    cannot be opened or read raises :class:`StoreError` naming its file and what is
    wrong (:func:`unreadable`), never the driver's traceback."""
    database = sqlite_file(url)
    read_only = schema == "current" and database is not None and not writable(database)
    engine = make_engine(url, read_only=read_only)
    try:
        if schema == "current":
            require_head(engine)
        else:
            upgrade(engine, only_empty=schema == "create")
    except SchemaNotCurrentError:
        engine.dispose()
        raise
    except sa_exc.DatabaseError as exc:  # OperationalError, and a corrupt file's
        engine.dispose()
        raise unreadable(url, exc, read_only=read_only) from exc
    return Store(engine, audit_key=audit_key, on_audit=on_audit)


class StoreUnreadableError(StoreError):
    """The store's file cannot be opened or read: corrupt, truncated, not a database, a
    folder, or in a folder that cannot be written. Waiting does not mend it."""

    code = "store_unreadable"
    retryable = False


def writable(database: Path) -> bool:
    """Whether this process can write the SQLite file ``database`` and its folder (where
    SQLite keeps its ``-wal`` and ``-shm`` files); a file not there yet: its folder."""
    folder = database.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return False
    except OSError:
        return False
    targets = [folder, database] if database.exists() else [folder]
    return all(os.access(target, os.W_OK) for target in targets)


# SQLite's words for a file that is not a (whole) database
_CORRUPT = ("not a database", "malformed", "encrypted")


@contextmanager
def read_by_command(store: Store) -> Iterator[None]:
    """Around a command's use of ``store``: a file found corrupt past its first pages
    (the open read those) is one line naming it too, not the driver's traceback."""
    try:
        yield
    except sa_exc.DatabaseError as exc:
        raise unreadable(store.engine.url, exc) from exc


def unreadable(url: str | URL, exc: sa_exc.DBAPIError, *, read_only: bool = False) -> StoreError:
    """One line for a store the driver could not open or read (``exc``): for SQLite its
    file and what is wrong with it (corrupt, a folder, read-only), for PostgreSQL the
    driver's error class and message as before."""
    orig = exc.orig
    text = str(orig)
    database = sqlite_file(url)
    if database is None:
        return StoreError(f"cannot open the database: {orig.__class__.__name__}: {text}")
    store = f"the SQLite store {database}"
    if any(word in text.lower() for word in _CORRUPT):
        return StoreUnreadableError(
            f"{store} cannot be read: {text} (the file is corrupt, cut short or not a "
            "radserve database). Stop every radserve using it, then restore the data dir "
            "from a backup, or move the file away and let `radserve serve` start an empty "
            "store"
        )
    if database.is_dir():
        return StoreUnreadableError(f"{store} is a folder, not a database file: {text}")
    if read_only and wal_pending(database):
        return StoreUnreadableError(
            f"{store} is in a folder that cannot be written and its write-ahead log "
            f"{database.name}-wal holds commits not yet merged into it (the server did not "
            f"stop cleanly): SQLite cannot read it there ({text}). Copy the data dir to "
            "writable storage and read the copy"
        )
    if not read_only and not writable(database):
        return StoreUnreadableError(
            f"{store} is in a read-only folder ({database.parent}: a read-only file system "
            f"or no write permission), and this command writes to it ({text}). Make the "
            "folder writable; `radserve keys list`, `audit verify` and `audit export` read "
            "a store on read-only media"
        )
    return StoreError(f"cannot open {store}: {orig.__class__.__name__}: {text}")


class Store(
    AccessMixin,
    ConsoleMixin,
    JoinMixin,
    LeaseMixin,
    MissMixin,
    RelocateMixin,
    ReplicaConfigMixin,
):
    """Typed access to radserve's database. Thread-safe; share one per process."""

    # -- jobs -----------------------------------------------------------------------

    def create_job(
        self,
        *,
        priority_class: PriorityClass | str,
        deadline: dt.datetime | dt.timedelta,
        pipeline_name: str,
        pipeline_version: str,
        precision: str,
        fingerprint: str,
        study_path: str,
        model_versions: Mapping[str, str] | None = None,
        arrival: dt.datetime | None = None,
        job_id: str | None = None,
        api_key_id: str | None = None,
        client_address: str | None = None,
        queue_meta: Mapping[str, Any] | None = None,
        cached_from: str | None = None,
        lease: Lease | None = None,
        audit_extra: Mapping[str, Any] | None = None,
        join: JoinRule | None = None,
        accession: str | None = None,
    ) -> JobRecord:
        """Persist a new job (state ``received``) and its audit record; committed on return.

        ``deadline`` may be a TAT (timedelta from ``arrival``). With ``cached_from`` (a
        succeeded job with the same cache key) the job is born ``succeeded`` with that
        job's result: a cache hit is answered without running anything. ``lease``: the
        accepting replica holds the job from its first moment (radserve.store.leases).
        ``audit_extra``: added to its audit record (identifiers, counts, digests only).
        ``join``: an unfinished job of the same input that the rule accepts is returned
        instead and nothing is created (a ``job.joined`` audit record names the second
        submitter); decided under a lock on the input (:mod:`radserve.store.joins`), so
        two replicas cannot both create one; so is a job of the input that succeeded
        after the submission's cache look-up (:attr:`JoinRule.results_seen`).
        :meth:`create_or_join` says which it was.
        ``accession``: the study's Accession Number, which the worklist searches (kept
        whole; None: not read, filled by radserve.console.accessions).
        """
        now = utc_now()
        arrival = arrival or now
        if isinstance(deadline, dt.timedelta):
            deadline = arrival + deadline
        row = Job(
            id=job_id or str(uuid.uuid4()),
            state=JobState.RECEIVED.value,
            priority_class=PriorityClass(priority_class).value,
            arrival=arrival,
            deadline=deadline,
            updated=now,
            pipeline_name=pipeline_name,
            pipeline_version=pipeline_version,
            precision=precision,
            model_versions=dict(model_versions or {}),
            fingerprint=fingerprint,
            study_path=study_path,
            attempts=0,
            api_key_id=api_key_id,
            client_address=client_address,
            accession=accession.strip() if accession is not None else None,
            stage_timings={},
            queue_meta=dict(queue_meta or {}),
        )
        if lease is not None and cached_from is None:
            lease.grant(row, now)
        with self._write() as session:
            if join is not None:
                lock_input(session, join.key)
            if session.get(Job, row.id) is not None:
                raise JobExistsError(f"a job with id {quoted(row.id)} exists already")
            if join is not None:
                # the unfinished job it joins, or a result recorded since its cache look-up
                found = answer(
                    session, join, actor_key_id=api_key_id, client_address=client_address
                )
                if found is not None:
                    logger.info("job %s answers a second submission of its study", found.id)
                    return found
            action = Action.JOB_SUBMITTED
            if cached_from is not None:
                source = session.get(Job, cached_from)
                if source is None or source.state != JobState.SUCCEEDED or not source.result_path:
                    raise InvalidTransitionError(
                        f"job {cached_from} has no result to reuse (it must have succeeded)"
                    )
                row.state, row.cached_from = JobState.SUCCEEDED.value, cached_from
                row.result_path = source.result_path
                row.started = row.finished = now
                action = Action.JOB_CACHED
            session.add(row)
            session.flush()
            record = jobq.to_record(row)
            audit_log.append(session, job_event(action, record, extra=audit_extra))
        logger.info("job %s created (%s, %s)", record.id, record.priority_class, record.state)
        return record

    def create_or_join(
        self, join: JoinRule, *, job_id: str, **fields: Any
    ) -> tuple[JobRecord, bool]:
        """:meth:`create_job` with ``join``: (the new job, False), or (the unfinished job
        of the same input the rule accepts, True) and nothing created; or (a succeeded job
        of the input recorded since the submission's cache look-up, True): its state says
        which (:func:`radserve.store.joins.answer`)."""
        record = self.create_job(job_id=job_id, join=join, **fields)
        return record, record.id != job_id

    def get_job(self, job_id: str) -> JobRecord:
        with self._read() as session:
            row = session.get(Job, job_id)
            if row is None:
                raise JobNotFoundError(f"no job with id {quoted(job_id)}")
            return jobq.to_record(row)

    def transition(
        self,
        job_id: str,
        new_state: JobState | str,
        *,
        actor_key_id: str | None = None,
        client_address: str | None = None,
        owner: str | None = None,
        **fields: Any,
    ) -> JobRecord:
        """Move a job along the state machine, setting ``fields`` (see ``UPDATABLE_FIELDS``).

        Entering ``running`` stamps ``started`` and counts an attempt; entering a final
        state stamps ``finished``. ``succeeded`` is reached only via :meth:`record_result`.
        Failures and cancellations are audited (``actor_key_id``: who cancelled).
        ``owner``: the write of a run, fenced by its lease (:class:`LeaseLostError` once
        another replica holds the job); a cancellation by request passes none.
        """
        target = JobState(new_state)
        if target == JobState.SUCCEEDED:
            raise InvalidTransitionError(
                f"job {job_id}: a job succeeds only through record_result(), which stores "
                "its result exactly once"
            )
        now = utc_now()
        values: dict[str, Any] = {
            **jobq.check_fields(fields),
            "state": target.value,
            "updated": now,
        }
        if target == JobState.RUNNING:
            values.update(started=now, attempts=Job.attempts + 1)
        if target in TERMINAL_STATES:
            values["finished"] = now
        sources = [s.value for s, targets in ALLOWED_TRANSITIONS.items() if target in targets]
        fence = [Job.lease_owner == owner] if owner is not None else []
        with self._write(audited=target in _AUDITED_STATES) as session:
            result = _execute_update(
                session,
                update(Job)
                .where(Job.id == job_id, Job.state.in_(sources), *fence)
                .values(**values)
                .execution_options(synchronize_session=False),
            )
            row = self._reload(session, job_id)
            if result.rowcount == 0:
                _check_owner(row, owner)
                raise InvalidTransitionError(_refusal(job_id, JobState(row.state), target))
            record = jobq.to_record(row)
            if target in _AUDITED_STATES:
                audit_log.append(
                    session,
                    job_event(
                        _AUDITED_STATES[target],
                        record,
                        actor_key_id=actor_key_id,
                        client_address=client_address,
                    ),
                )
        logger.info("job %s -> %s", job_id, target)
        return record

    def reprioritise_job(
        self,
        job_id: str,
        priority_class: PriorityClass,
        deadline: dt.datetime,
        *,
        actor_key_id: str | None,
        client_address: str | None,
        extra: Mapping[str, Any],
    ) -> JobRecord:
        """Record a job's new class and deadline (the scheduler re-filed it already), with
        a ``job.reprioritised`` audit record (who, ``extra``: old and new) in the same
        transaction. In any state: the job may have started since the scheduler's
        change, which stands."""
        record = self.refile_row(
            job_id,
            priority_class,
            deadline,
            when=lambda _row: True,
            actor_key_id=actor_key_id,
            client_address=client_address,
            extra=extra,
        )
        assert record is not None  # written whatever the row says
        logger.info("job %s re-prioritised -> %s", job_id, record.priority_class)
        return record

    def add_job_warning(self, job_id: str, warning: Mapping[str, str]) -> JobRecord:
        """Record a warning on a job (``queue_meta["warnings"]``, in any state); one of
        the same ``code`` is replaced. For what is learnt about a job's input after it
        was submitted (late instances at the gateway): the report stage copies the
        warnings into the report if it has not run yet, and the API shows them."""
        with self._write(audited=False) as session:
            row = session.execute(
                select(Job).where(Job.id == job_id).with_for_update()
            ).scalar_one_or_none()
            if row is None:
                raise JobNotFoundError(f"no job with id {quoted(job_id)}")
            meta = dict(row.queue_meta or {})
            kept = [w for w in meta.get("warnings") or [] if w.get("code") != warning["code"]]
            meta["warnings"] = [*kept, dict(warning)]
            row.queue_meta = meta
            row.updated = utc_now()
            session.flush()
            return jobq.to_record(row)

    def record_result(
        self,
        job_id: str,
        result_path: str,
        cache_key: CacheKey | None = None,
        *,
        stage_timings: Mapping[str, float] | None = None,
        outputs: Mapping[str, Any] | None = None,
        owner: str | None = None,
    ) -> JobRecord:
        """Mark a running job succeeded with its result, exactly once, and cache it.

        A second call for the same job raises :class:`ResultAlreadyRecordedError` (the
        caller discards its copy); a job cancelled meanwhile raises
        :class:`InvalidTransitionError`. ``outputs`` is a summary for the audit record
        (counts, labels; no patient data). If another job already cached the same key,
        the earlier entry stays and this job's result is still recorded on the job.

        ``owner`` fences the write by the job's lease (:class:`LeaseLostError` once
        another replica took the job over) and releases the outbox rows that owner held
        for this result (``held -> pending``) in the same transaction: a result's
        deliveries go out if and only if the result is the recorded one.
        """
        now = utc_now()
        values: dict[str, Any] = {
            "state": JobState.SUCCEEDED.value,
            "result_path": result_path,
            "finished": now,
            "updated": now,
        }
        if stage_timings is not None:
            values["stage_timings"] = dict(stage_timings)
        fence = [Job.lease_owner == owner] if owner is not None else []
        with self._write() as session:
            result = _execute_update(
                session,
                update(Job)
                .where(
                    Job.id == job_id,
                    Job.state == JobState.RUNNING.value,
                    Job.result_path.is_(None),
                    *fence,
                )
                .values(**values)
                .execution_options(synchronize_session=False),
            )
            row = self._reload(session, job_id)
            if result.rowcount == 0:
                _check_owner(row, owner)
                if row.result_path is not None:
                    raise ResultAlreadyRecordedError(
                        f"job {job_id} already has a result; results are recorded once",
                        existing_result_path=row.result_path,
                    )
                raise InvalidTransitionError(
                    _refusal(job_id, JobState(row.state), JobState.SUCCEEDED)
                )
            if cache_key is not None:
                if cache_key.fingerprint != row.fingerprint:
                    raise StoreError(f"job {job_id}: cache key fingerprint is not the job's input")
                self._insert_cache_entry(session, cache_key, job_id, now)
            held = [OutboxDelivery.job_id == job_id, OutboxDelivery.state == HELD]
            if owner is not None:
                held.append(OutboxDelivery.lease_owner == owner)
            # due in the database's time, as every outbox row is (any replica sends it)
            due = database_time(session) if self.dialect == "postgresql" else now
            session.execute(
                update(OutboxDelivery)
                .where(*held)
                .values(state="pending", next_attempt_at=due, updated=due, lease_owner=None)
                .execution_options(synchronize_session=False)
            )
            record = jobq.to_record(row)
            extra = {"outputs": dict(outputs)} if outputs else None
            audit_log.append(session, job_event(Action.JOB_SUCCEEDED, record, extra=extra))
        logger.info("job %s succeeded", job_id)
        return record

    def find_cached_result(self, key: CacheKey) -> JobRecord | None:
        """The succeeded job whose result answers ``key``, if any."""
        with self._read() as session:
            row = session.execute(
                select(Job)
                .join(CachedResult, CachedResult.job_id == Job.id)
                .where(
                    CachedResult.fingerprint == key.fingerprint,
                    CachedResult.pipeline_name == key.pipeline_name,
                    CachedResult.pipeline_version == key.pipeline_version,
                    CachedResult.model_versions_key == key.model_versions_key,
                    CachedResult.precision == key.precision,
                    Job.state == JobState.SUCCEEDED.value,
                )
            ).scalar_one_or_none()
            return jobq.to_record(row) if row is not None else None

    def list_jobs(
        self,
        *,
        state: JobState | str | Iterable[JobState | str] | None = None,
        priority_class: PriorityClass | str | None = None,
        pipeline: str | None = None,
        created_after: dt.datetime | None = None,
        created_before: dt.datetime | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        """Jobs newest first; ``created_*`` bound the arrival time (after: inclusive).
        Every job, whoever may see it (:func:`radserve.store.jobs.list_jobs` takes the
        visibility rule into the query)."""
        return jobq.list_jobs(
            self,
            state=state,
            priority_class=priority_class,
            pipeline=pipeline,
            created_after=created_after,
            created_before=created_before,
            limit=limit,
            cursor=cursor,
        )

    def cached_copies(self, job_id: str) -> list[JobRecord]:
        """The jobs answered from ``job_id``'s result (``cached_from``), oldest first: its
        DICOM results are indexed under ``job_id`` alone, yet they are theirs too."""
        with self._read() as session:
            rows = session.execute(
                select(Job).where(Job.cached_from == job_id).order_by(Job.arrival, Job.id)
            ).scalars()
            return [jobq.to_record(row) for row in rows]

    def find_answered(
        self, key: CacheKey, source: str, sees: Callable[[str | None], bool] | None = None
    ) -> JobRecord | None:
        """The job that already answers ``key`` for the route ``source`` (its
        ``queue_meta["source"]``): a succeeded one -- one that ran, or one answered from
        the result cache -- oldest first, else an unfinished one. A study re-sent over
        the same route is answered by it, so what that route was sent is not sent again.
        ``sees`` (the submitter's visibility rule, by a job's key id): only a job it may
        see answers; another site's job of the same route does not (that site's answer
        left the submitter a job id it could not read, and no job of its own)."""
        states = (JobState.SUCCEEDED, *UNFINISHED_STATES)
        found = [
            job
            for job in self._jobs_for(key, states)
            if job.queue_meta.get("source") == source and (sees is None or sees(job.api_key_id))
        ]
        succeeded = [job for job in found if job.state is JobState.SUCCEEDED]
        return (succeeded or found or [None])[0]

    def succeeded_jobs_for(self, key: CacheKey) -> list[JobRecord]:
        """Every succeeded job whose input, pipeline, precision and models are ``key``'s,
        oldest first: those that ran and those answered from the cache."""
        return self._jobs_for(key, (JobState.SUCCEEDED,))

    def unfinished_jobs_for(self, key: CacheKey) -> list[JobRecord]:
        """Every unfinished job for ``key``, oldest first (read-only)."""
        return self._jobs_for(key, UNFINISHED_STATES)

    def _jobs_for(self, key: CacheKey, states: Iterable[JobState]) -> list[JobRecord]:
        """Jobs in ``states`` whose input, pipeline, precision and models are ``key``'s,
        oldest first."""
        with self._read() as session:
            return [jobq.to_record(row) for row in jobq.jobs_of_input(session, key, states)]

    def unfinished_jobs(self) -> list[JobRecord]:
        """Jobs not yet in a final state, earliest deadline first (read-only)."""
        with self._read() as session:
            rows = session.execute(
                select(Job)
                .where(Job.state.in_([s.value for s in UNFINISHED_STATES]))
                .order_by(Job.deadline, Job.arrival, Job.id)
            ).scalars()
            return [jobq.to_record(row) for row in rows]

    def requeue_unfinished(self) -> list[JobRecord]:
        """Restart recovery: received and running jobs go back to queued; all are returned.

        Every unfinished job is resumed, so each gets a ``job.requeued`` audit record
        (with the state the previous run left it in) in the same transaction.
        ``attempts`` is not reset, so a study that crashes the server every time it
        runs reaches the retry limit and fails instead of looping.
        """
        now = utc_now()
        moved = 0
        with self._write() as session:
            rows = session.scalars(
                select(Job)
                .where(Job.state.in_([s.value for s in UNFINISHED_STATES]))
                .order_by(Job.deadline, Job.arrival, Job.id)
            ).all()
            for row in rows:
                previous = row.state
                if previous != JobState.QUEUED.value:
                    row.state, row.updated = JobState.QUEUED.value, now
                    moved += 1
                session.flush()
                audit_log.append(
                    session,
                    job_event(
                        Action.JOB_REQUEUED,
                        jobq.to_record(row),
                        extra={"reason": "restart_recovery", "previous_state": previous},
                    ),
                )
        if rows:
            logger.warning(
                "restart recovery: %d unfinished job(s) resumed (%d interrupted)", len(rows), moved
            )
        return self.unfinished_jobs()

    # -- helpers --------------------------------------------------------------------

    @staticmethod
    def _reload(session: Session, job_id: str) -> Job:
        row = session.execute(
            select(Job).where(Job.id == job_id).execution_options(populate_existing=True)
        ).scalar_one_or_none()
        if row is None:
            raise JobNotFoundError(f"no job with id {quoted(job_id)}")
        return row

    @staticmethod
    def _insert_cache_entry(session: Session, key: CacheKey, job_id: str, now: dt.datetime) -> None:
        dialect_insert = (
            postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
        )
        statement = (
            dialect_insert(CachedResult)
            .values(
                fingerprint=key.fingerprint,
                pipeline_name=key.pipeline_name,
                pipeline_version=key.pipeline_version,
                model_versions_key=key.model_versions_key,
                precision=key.precision,
                job_id=job_id,
                created=now,
            )
            .on_conflict_do_nothing()
        )
        session.execute(statement)


def _execute_update(session: Session, statement: Update) -> CursorResult[Any]:
    """Run an UPDATE; its result carries ``rowcount`` (how many rows matched)."""
    return cast(CursorResult[Any], session.execute(statement))


def _check_owner(row: Job, owner: str | None) -> None:
    """After a refused write of a run: raise :class:`LeaseLostError` if the job is no
    longer ``owner``'s."""
    if owner is not None and row.lease_owner != owner:
        raise LeaseLostError(
            f"job {row.id} is held by another replica now ({row.lease_owner}); "
            "this run of it is discarded"
        )


def _refusal(job_id: str, current: JobState, target: JobState) -> str:
    allowed = sorted(s.value for s in ALLOWED_TRANSITIONS[current])
    return (
        f"job {job_id} is {current.value} and cannot become {target.value} "
        f"(from {current.value} it may become: {', '.join(allowed) or 'nothing, it is final'})"
    )
