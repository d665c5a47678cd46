"""Accepting studies: durable files, a committed job row, then the scheduler.

The order is the promise behind HTTP 202 (and C-STORE success): the study's files are
fsynced into the content-addressed store (:func:`radserve.store.files.store_study`),
then the job row is committed, and only then is the job scheduled and acknowledged.
A study whose (fingerprint, pipeline, model versions, precision) already has a result
is answered from the result cache: a new job, born ``succeeded``, marked cached.

Admission is exact under concurrency: a queue place is *reserved* (:class:`Admission`)
before an upload's files are stored or its job row created, and the reservation turns
into the scheduler's queue entry under the same lock. A request refused for a full
queue therefore leaves no files, no job row and no audit record behind. A study whose
job waits already (or that has a result) needs no place: when the reservation fails,
the upload is read, not stored, to know which study it is (:mod:`radserve.service.upload_key`),
and only then refused or answered by that job.

radserve's own results (SEG/SR/SC a PACS or a client sends back with the study) are never
input: the REST upload leaves them out (:mod:`radserve.service.own_uploads`) before the
study is stored, as the SCP and STOW-RS do before filing. The gateways submit with
``reuse=True``: a study re-sent unchanged (same fingerprint) over the same route while a
job for it exists — succeeded (run or cached) or still running — gets no new job at all,
so nothing is run or sent again.

A study submitted again while its job of the same route is unfinished (received, queued
or running) and visible to the submitter joins that job: no second job, decided under a
lock on the input so replicas sharing PostgreSQL agree (:mod:`radserve.service.duplicates`).
That lock is the only way an unfinished job answers (the ``reuse`` look-up answers with a
succeeded one), and a result recorded after the result cache's look-up is found under it
and answers from the cache (:meth:`Intake.submit_stored`).

A result reused from the cache by a job of another route still gets that route's
deliveries: a study first uploaded over HTTP and then pushed by the PACS gets its SEG/SR
(written from the cached report and label maps, no model run) sent to the PACS, once;
see :attr:`Intake.cached_delivery`.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

from radserve.config import Settings
from radserve.errors import RadserveError
from radserve.gateway.own_results import OwnResults
from radserve.ingest import IngestPolicy
from radserve.ingest.stored import stored_accession
from radserve.scheduling import (
    JobRequest,
    ModelUnavailableError,
    PriorityClass,
    PriorityRules,
    QueueFullError,
    Scheduler,
)
from radserve.service.catalog import Catalog, ResolvedPipeline
from radserve.service.duplicates import join_rule, raise_priority, warm
from radserve.service.errors import InvalidRequestError
from radserve.service.failover import SharedStorage
from radserve.service.jobcache import JobCache
from radserve.service.jobs import JobRefiler
from radserve.service.own_uploads import without_own_results
from radserve.service.schema_watch import HELD_REASON as SCHEMA_HELD_REASON
from radserve.service.schema_watch import SchemaChangedError
from radserve.service.selection_door import SelectionDoor
from radserve.service.sniff import FileKind, check_combination, sniff
from radserve.service.study_attributes import stream_attributes, study_attributes
from radserve.service.unclaimed import set_aside_if_refused
from radserve.service.upload_key import upload_accession, upload_fingerprint
from radserve.service.work import LineageStep, build_work
from radserve.store import CacheKey, JobRecord, JobState, Lease, Store
from radserve.store.errors import JobExistsError
from radserve.store.joins import JoinRule
from radserve.store.waiting import waiting_for_store

logger = logging.getLogger(__name__)
T = TypeVar("T")

RESULTS_DIR = "results"
DICOMWEB_SOURCE = "dicomweb"  # Origin.source of studies stored over STOW-RS
# rounds of a submission sent back to the result cache by a result recorded meanwhile
_ANSWER_TRIES = 3


@dataclass(frozen=True)
class Submission:
    """What intake answers: the job, whether it came from the cache, its queue place."""

    job: JobRecord
    cached: bool = False
    position: int | None = None
    # an existing job answers an unchanged re-send (``reuse=True``): no new job row
    reused: bool = False
    # the unfinished job of the same input answers it (radserve.service.duplicates)
    joined: bool = False


@dataclass(frozen=True)
class Origin:
    """Who submitted: the API key and client address (audited), and by which route."""

    key_id: str | None = None
    client: str | None = None
    source: str = "api"  # "api" | "dicom" | "dicomweb"
    # known at submission, for the report: {"code", "message", "stage"} (no PHI)
    warnings: tuple[Mapping[str, str], ...] = ()
    # under security.visibility: whether the submitter may see a job submitted by this
    # key or user (None: every earlier result may answer it). A result made for a job it
    # may not see is not reused: an instant "cached" answer told one site that another
    # had analysed exactly this study (its patient had been there)
    sees: Callable[[str | None], bool] | None = field(default=None, compare=False)


def parse_priority(value: str | None) -> PriorityClass | None:
    if value is None or not value.strip():
        return None
    try:
        return PriorityClass.parse(value)
    except ValueError as exc:
        raise InvalidRequestError(f"priority: {exc}") from None


class Slot:
    """One reserved queue place of ``cls``; released exactly once."""

    def __init__(self, admission: Admission, cls: PriorityClass) -> None:
        self.admission = admission
        self.cls = cls
        self.held = True

    def release(self) -> None:
        """Give the place back (the study was answered from the cache, or failed)."""
        with self.admission.lock:
            self.release_locked()

    def release_locked(self) -> None:
        if self.held:
            self.held = False
            self.admission.reserved[self.cls] -= 1


class Admission:
    """Queue places reserved between the room check and the scheduler's queue entry.

    Invariant (under :attr:`lock`): waiting jobs + reserved places <= the class's limit.
    :meth:`reserve` refuses when no place is left; :meth:`entering` hands a job to the
    scheduler and releases its place in one critical section, so a place is never
    counted twice (spurious refusals) nor not at all (too many admitted)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.lock = threading.Lock()
        self.reserved: Counter[PriorityClass] = Counter()

    def reserve(self, cls: PriorityClass) -> Slot:
        limit = self.scheduler.config.queue_limit(cls)
        with self.lock:
            if limit is not None:
                waiting = self.scheduler.snapshot().queued.get(cls, 0)
                taken = waiting + self.reserved[cls]
                if taken >= limit:
                    retry_after = self.scheduler.config.default_retry_after_s
                    raise QueueFullError(
                        f"the {cls.name.lower()} queue is full ({waiting} studies waiting, "
                        f"{taken - waiting} being admitted, limit {limit}); retry after "
                        f"{retry_after} s",
                        retry_after=retry_after,
                    )
            self.reserved[cls] += 1
        return Slot(self, cls)

    @contextmanager
    def entering(self, slot: Slot | None) -> Iterator[None]:
        """Hold the admission lock while a job enters the scheduler; ``slot`` (if any)
        is released as it does, whatever the outcome."""
        with self.lock:
            try:
                yield
            finally:
                if slot is not None:
                    slot.release_locked()


class Intake:
    """Submissions from the API and the DICOM gateway; thread-safe."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store,
        scheduler: Scheduler,
        catalog: Catalog,
        cache: JobCache,
        rules: PriorityRules,
        policy: IngestPolicy,
        dicom_results: Callable[[JobRecord], bool] = lambda job: False,
        own_results: OwnResults | None = None,
        storage: SharedStorage,
    ) -> None:
        self.settings = settings
        self.store = store
        self.scheduler = scheduler
        self.catalog = catalog
        self.cache = cache
        self.rules = rules
        self.policy = policy
        self.dicom_results = dicom_results
        self.admission = Admission(scheduler)
        # a more urgent duplicate raises the waiting job's class (radserve.service.duplicates)
        self.refiler = JobRefiler(scheduler, store, cache)
        self.own_results = own_results or OwnResults()
        # where studies and results are written (the data folder, or a local fallback)
        self.storage = storage
        # the result generation step (radserve.service.lineage); set by the service
        self.lineage: LineageStep | None = None
        # model deployments (radserve.service.lifecycle): (resolved, routing key,
        # priority) -> the versions this study runs; set by the service
        self.router: Router | None = None
        # this replica's job lease: a job it accepts is its own from creation on
        self.lease: Lease | None = None
        # a result reused from the cache for another route: (new job id, route, the job
        # whose result it reuses, the stored study) -> that route's deliveries written
        # and queued from the cached result, idempotently (raises when they cannot be);
        # set by the service (radserve.service.cached); returns {file name: sha256} of
        # what it delivered
        self.cached_delivery: Callable[[str, str, JobRecord, Path], dict[str, str]] | None = None

    @property
    def results_root(self) -> Path:
        return self.settings.data_dir / RESULTS_DIR

    # --- checks that need no upload -------------------------------------------------
    def precheck(self, pipeline: str | None, priority: PriorityClass | None) -> ResolvedPipeline:
        """Refuse early what can be refused before reading the upload: an unknown
        pipeline or model. Not a full queue, even for a stated class: a study whose job
        waits already is answered by that job, and which study it is is known only once
        the upload is read (:mod:`radserve.service.upload_key`). ``priority`` is kept
        for the callers."""
        del priority
        self._check_schema()
        resolved = self.catalog.resolve(pipeline)
        self._check_models(resolved)
        return resolved

    def _check_schema(self) -> None:
        """Refuse every new study once a newer radserve migrated the database beneath this
        server (radserve.service.schema_watch): another replica, of the newer radserve,
        takes it; this one stops."""
        held = self.scheduler.held
        if held is not None and held.reason == SCHEMA_HELD_REASON:
            raise SchemaChangedError(held.message)

    def _check_models(self, resolved: ResolvedPipeline) -> None:
        open_models = self.scheduler.open_models()
        for model in resolved.model_versions:
            if model in open_models:
                raise ModelUnavailableError(
                    f"model {model} is unavailable (its circuit breaker is open); "
                    "an administrator must reset it",
                    model=model,
                )

    # --- submissions ------------------------------------------------------------------
    def submit_upload(
        self,
        files: Sequence[BinaryIO],
        *,
        resolved: ResolvedPipeline,
        priority: PriorityClass | None,
        origin: Origin,
    ) -> Submission:
        """Check, store durably and schedule one study made of ``files`` (streams).

        The queue place is reserved before a byte is stored: a refused upload leaves
        nothing behind. A study none of whose series the pipeline can use (its selection
        rules, the planes its slice models read) is refused before it is published,
        with the error its job would have failed with
        (:mod:`radserve.service.selection_door`)."""
        members = self.settings.ingest.max_archive_members
        kinds = [
            sniff(stream, i + 1, len(files), max_archive_members=members)
            for i, stream in enumerate(files)
        ]
        check_combination(kinds)
        if priority is None:
            priority = self.rules.classify(stream_attributes(files, self.rules.keywords))
        slot: Slot | None = None
        full: QueueFullError | None = None
        try:
            slot = self.reserve(priority, resolved)
        except QueueFullError as exc:
            # a study whose job or result exists needs no queue place; read (not stored)
            # to know which study it is (radserve.service.upload_key)
            if not self._may_be_answered(files, kinds, resolved, priority, origin):
                raise
            full = exc
        try:
            # a study none of whose series the pipeline can use is refused here (422),
            # judged on its staged files' headers: no study folder, no job
            door = SelectionDoor.for_upload(
                kinds,
                resolved.spec,
                self.catalog.registry,
                self.policy,
                planes=self.router is None or not self.router.needs_routing(),
            )
            seen = None if door is None else door.seen
            with without_own_results(files, kinds, self.own_results, seen=seen) as pairs:
                stored = self.storage.store_study(
                    pairs,
                    max_bytes=self.settings.server.max_upload_bytes,
                    check=None if door is None else door.staged_check(),
                )
            return self.submit_stored(
                stored.path,
                stored.fingerprint,
                resolved=resolved,
                priority=priority,
                origin=origin,
                slot=slot,
                queue_full=full,
            )
        finally:
            if slot is not None:
                slot.release()  # a no-op once the job entered the scheduler

    def _may_be_answered(
        self,
        files: Sequence[BinaryIO],
        kinds: Sequence[FileKind],
        resolved: ResolvedPipeline,
        priority: PriorityClass,
        origin: Origin,
    ) -> bool:
        """Whether an upload the full queue refused may be answered all the same: a job
        the submitter may see has its Accession Number (one header read) and its input
        (hashed, nothing stored) has an unfinished job of the route or a result. Jobs
        it may not see count for nothing, so a refusal takes as long as for a new study
        (the time would tell another site has it). A rough look: :meth:`submit_stored`
        decides under the input's lock."""
        sees = origin.sees or (lambda submitter: True)
        accession = upload_accession(files)
        if accession is not None:
            submitters = self._waited(
                lambda: self.store.accession_submitters(accession, resolved.spec.name),
                "the jobs of its accession number",
            )
            if not any(sees(submitter) for submitter in submitters):
                return False  # no job it may see has its study's number: not read further
        max_bytes = self.settings.server.max_upload_bytes
        with without_own_results(files, kinds, self.own_results) as pairs:
            fingerprint = upload_fingerprint(pairs, max_bytes=max_bytes)
        if fingerprint is None:
            return False
        if self.router is not None and self.router.needs_routing():
            uid = stream_attributes(files, ("StudyInstanceUID",)).get("StudyInstanceUID")
            resolved = self.router.route(resolved, uid or fingerprint, priority)
        key = resolved.cache_key(fingerprint)

        def covered() -> bool:
            unfinished = self.store.unfinished_jobs_for(key)
            if any(
                job.queue_meta.get("source") == origin.source and sees(job.api_key_id)
                for job in unfinished
            ):
                return True
            return any(sees(job.api_key_id) for job in self.store.succeeded_jobs_for(key))

        return self._waited(covered, "the jobs of its input")

    def reserve(self, cls: PriorityClass, resolved: ResolvedPipeline) -> Slot:
        """A queue place for a new job of ``cls`` (raises :class:`QueueFullError`), once
        no model the pipeline needs has an open breaker (:class:`ModelUnavailableError`)."""
        self._check_schema()
        self._check_models(resolved)
        return self.admission.reserve(cls)

    def submit_stored(
        self,
        study_dir: Path,
        fingerprint: str,
        *,
        resolved: ResolvedPipeline,
        priority: PriorityClass | None,
        origin: Origin,
        attributes: Mapping[str, str] | None = None,
        slot: Slot | None = None,
        reuse: bool = False,
        queue_full: QueueFullError | None = None,
    ) -> Submission:
        """A study already in the content-addressed store -> a job (cached or queued).

        ``slot``: a queue place reserved by the caller (else one is reserved here).
        ``reuse``: when a job of the same route for exactly this input succeeded (run or
        cached), answer with it and create nothing (:meth:`Store.find_answered`); an
        unfinished one answers through the locked join, before the result cache.
        ``queue_full``: the caller's reservation was refused: only what covers the input
        answers (its unfinished job, a result), else that refusal is raised; a full queue
        met here is treated so too. Refused (the database did not answer within
        ``server.store_wait_s``, a full queue, ...): the study is set aside, and deleted
        later unless a job names it (radserve.service.unclaimed)."""
        with set_aside_if_refused(self.settings.data_dir, study_dir):
            if self.router is not None and self.router.needs_routing():
                if priority is None and slot is not None:
                    priority = slot.cls
                if priority is None:
                    attributes = attributes or study_attributes(study_dir, self.rules.keywords)
                    priority = self.rules.classify(attributes)
                uid = study_attributes(study_dir, ("StudyInstanceUID",)).get("StudyInstanceUID")
                resolved = self.router.route(resolved, uid or fingerprint, priority)
            key = resolved.cache_key(fingerprint)
            return self._answer(
                study_dir, key, resolved, priority, origin, attributes, slot, reuse, queue_full
            )

    def _answer(
        self,
        study_dir: Path,
        key: CacheKey,
        resolved: ResolvedPipeline,
        priority: PriorityClass | None,
        origin: Origin,
        attributes: Mapping[str, str] | None,
        slot: Slot | None,
        reuse: bool,
        queue_full: QueueFullError | None,
    ) -> Submission:
        """:meth:`submit_stored` once routed. Every answer by an existing job is taken
        under the input's lock, and a result recorded between the result cache's look-up
        and that lock sends the submission back to the cache (at most
        ``_ANSWER_TRIES`` rounds; the last inserts), so a job that finished between the
        two reads is not run a second time."""
        fingerprint = key.fingerprint

        def asked() -> PriorityClass:
            nonlocal attributes
            if priority is not None:
                return priority
            if slot is not None:
                return slot.cls
            if attributes is None:
                attributes = study_attributes(study_dir, self.rules.keywords)
            return self.rules.classify(attributes)

        try:
            tries = 0
            while True:
                tries += 1
                # counted before the cache's look-up: a result recorded after it is found
                # under the lock (radserve.store.joins.answer)
                seen = self._waited(
                    lambda: warm(self.store, key, origin.sees), "the jobs of its input"
                )

                def rule(seen: int = seen, last: bool = tries >= _ANSWER_TRIES) -> JoinRule:
                    return join_rule(
                        key,
                        source=origin.source,
                        priority=asked(),
                        sees=origin.sees,
                        scheduler=self.scheduler,
                        results_seen=None if last else seen,
                    )

                if reuse:
                    # same input, same route (a result made for an HTTP upload went nowhere):
                    # the job that answered it -- run or cached -- answers the re-send too
                    existing = self._waited(
                        lambda: self.store.find_answered(key, origin.source, origin.sees),
                        "a re-sent study's earlier job",
                    )
                    if existing is not None and existing.state is JobState.SUCCEEDED:
                        logger.info(
                            "study re-sent unchanged: job %s (%s) answers it; no new job",
                            existing.id,
                            existing.state.value,
                        )
                        return Submission(existing, cached=True, reused=True)
                    if existing is not None:  # unfinished: joined before a cached answer,
                        # which would send this route the result a second time
                        record = self._join_only(rule(), origin)
                        if record is not None and record.state is JobState.SUCCEEDED:
                            continue  # it finished meanwhile: the re-send is answered by it
                        if record is not None:
                            return self._joined(record, asked(), origin)
                hit = self._waited(
                    lambda: self._cached_result(key, origin), "the result cache's look-up"
                )
                job_id = str(uuid.uuid4())
                delivered = (
                    None if hit is None else self._deliver_cached(job_id, origin, hit, study_dir)
                )
                if hit is not None and delivered is not None:
                    return self._from_cache(
                        hit, resolved, study_dir, fingerprint, priority, origin, job_id=job_id,
                        delivered=delivered,
                    )  # fmt: skip
                # else: a hit whose result cannot go this route is run again (its entry stays)
                cls = asked()
                if slot is None and queue_full is None:
                    try:
                        slot = self.reserve(cls, resolved)
                    except QueueFullError as exc:
                        queue_full = exc
                if slot is None:
                    # the queue is full: only a job that covers this input answers it (a
                    # duplicate takes no queue place), else the refusal stands
                    assert queue_full is not None
                    record = self._join_only(rule(), origin)
                    if record is None:
                        raise queue_full
                    if record.state is JobState.SUCCEEDED:
                        continue  # a result recorded meanwhile: the cache answers
                    return self._joined(record, cls, origin)
                # the same input submitted again while its job is unfinished: that job answers
                # it (decided with the row's insert, under a lock: radserve.service.duplicates)
                record = self._new_job(
                    cls, resolved, study_dir, fingerprint, origin, job_id=job_id, join=rule()
                )
                if record.id != job_id and record.state is JobState.SUCCEEDED:
                    continue  # its job finished since the cache's look-up: the cache answers
                if record.id != job_id:
                    return self._joined(record, cls, origin)
                position = self.schedule(record, resolved, slot=slot)
                return Submission(
                    self.cache.get(record.id) or record, cached=False, position=position
                )
        finally:
            if slot is not None:
                slot.release()  # a no-op once the job entered the scheduler

    def _join_only(self, join: JoinRule, origin: Origin) -> JobRecord | None:
        """The unfinished job ``join`` accepts (audited ``job.joined``), or a result
        recorded since the look-ups (its state: succeeded), or None; creates nothing."""
        return self._waited(
            lambda: self.store.join_unfinished(
                join, actor_key_id=origin.key_id, client_address=origin.client
            ),
            "the jobs of its input",
        )

    def _joined(self, job: JobRecord, priority: PriorityClass, origin: Origin) -> Submission:
        """The answer of a submission that joined the unfinished ``job`` (raised to
        ``priority`` when more urgent and still waiting here)."""
        record = raise_priority(
            job, priority, refiler=self.refiler, key_id=origin.key_id, client=origin.client
        )
        logger.info(
            "study submitted again while job %s is %s: that job answers it; no new job",
            record.id,
            record.state.value,
        )
        return Submission(self.cache.get(record.id) or record, joined=True)

    def _cached_result(self, key: CacheKey, origin: Origin) -> JobRecord | None:
        """The succeeded job whose result answers ``key`` for ``origin``: the cache's
        entry, or, when the submitter may not see that job (``Origin.sees``), the oldest
        succeeded job for ``key`` it may see (one that ran before one answered from the
        cache), else None: the study runs again."""
        hit = self.store.find_cached_result(key)
        if hit is None or origin.sees is None or origin.sees(hit.api_key_id):
            return hit
        seen = [job for job in self.store.succeeded_jobs_for(key) if origin.sees(job.api_key_id)]
        seen.sort(key=lambda job: job.cached_from is not None)  # stable: oldest first
        return seen[0] if seen else None

    def _deliver_cached(
        self, job_id: str, origin: Origin, hit: JobRecord, study_dir: Path
    ) -> dict[str, str] | None:
        """Whether the result of ``hit`` can answer a new job ``job_id`` of ``origin``'s
        route: what that route sends on (the SEG/SR to the PACS, ...) is written from the
        cached result and queued *before* the job row exists (see
        :attr:`cached_delivery`), so a crash in between loses nothing and a re-send
        queues nothing twice. Returns ``{file name: sha256}`` of what was delivered (for
        the job's audit record); None (logged): it cannot, and the study runs again."""
        if self.cached_delivery is None:
            return {}
        try:
            return self.cached_delivery(job_id, origin.source, hit, study_dir)
        except Exception as exc:  # the study is run instead: nothing is lost
            code = getattr(exc, "code", type(exc).__name__)
            logger.warning(
                "the cached result of job %s cannot be delivered on route %s (%s); the "
                "study runs again",
                hit.id,
                origin.source,
                code,
            )
            return None

    def _new_job(
        self,
        priority: PriorityClass,
        resolved: ResolvedPipeline,
        study_dir: Path,
        fingerprint: str,
        origin: Origin,
        **extra: Any,
    ) -> JobRecord:
        """Persist a job row (and cache it) for a study in ``study_dir``; waits out a
        database outage up to ``server.store_wait_s`` (:meth:`_waited`). ``join``
        (:class:`JoinRule`): the unfinished job it names is returned instead, uncached
        (its id is not ``job_id``)."""
        job_id = extra.pop("job_id", None) or str(uuid.uuid4())
        join: JoinRule | None = extra.pop("join", None)
        fields: dict[str, Any] = {
            "priority_class": priority,
            "deadline": dt.timedelta(seconds=self.scheduler.config.tat(priority)),
            "pipeline_name": resolved.spec.name,
            "pipeline_version": resolved.spec.version,
            "precision": resolved.precision,
            "fingerprint": fingerprint,
            "study_path": str(study_dir),
            "model_versions": resolved.model_versions,
            "api_key_id": origin.key_id,
            "client_address": origin.client,
            # on the row, so the console's worklist searches all jobs in the query
            "accession": stored_accession(study_dir, self.policy),
            "queue_meta": {"source": origin.source}
            | ({"warnings": [dict(w) for w in origin.warnings]} if origin.warnings else {})
            | deployment_meta(resolved),
            "lease": self.lease,
            "job_id": job_id,
            **extra,
        }
        tried = False

        def create() -> JobRecord:
            nonlocal tried
            again, tried = tried, True
            try:
                if join is not None:
                    return self.store.create_or_join(join, **fields)[0]
                return self.store.create_job(**fields)
            except JobExistsError:
                if not again:
                    raise
                # an earlier try committed and only its answer was lost (the connection
                # cut after COMMIT): that row is this job's
                return self.store.get_job(job_id)

        record = self._waited(create, "the job row's write")
        if record.id == job_id:  # a joined job is cached as this server last saw it
            self.cache.put(record)
        return record

    def _waited(self, call: Callable[[], T], what: str) -> T:
        """``call()`` (a store call of a submission), waiting out a database outage up
        to ``server.store_wait_s``; past it 503 with Retry-After (radserve.store.waiting)."""
        return waiting_for_store(call, self.settings.server.store_wait_s, what=what)

    def _from_cache(
        self,
        hit: JobRecord,
        resolved: ResolvedPipeline,
        study_dir: Path,
        fingerprint: str,
        priority: PriorityClass | None,
        origin: Origin,
        *,
        job_id: str,
        delivered: Mapping[str, str],
    ) -> Submission:
        cls = PriorityClass.parse(str(hit.priority_class)) if priority is None else priority
        # what this route was sent from the cached result, by digest, in the audit chain
        extra = {"outputs": {"sha256": dict(delivered)}} if delivered else None
        record = self._new_job(
            cls, resolved, study_dir, fingerprint, origin, cached_from=hit.id, job_id=job_id,
            audit_extra=extra,
        )  # fmt: skip
        logger.info("job %s answered from the result cache (job %s)", record.id, hit.id)
        return Submission(record, cached=True)

    def schedule(
        self,
        record: JobRecord,
        resolved: ResolvedPipeline,
        *,
        resume: bool = False,
        slot: Slot | None = None,
        folder: str | None = None,
    ) -> int | None:
        """Hand a persisted job to the scheduler, turning ``slot`` into its queue entry;
        a refusal (possible only without a slot, or a breaker that opened meanwhile)
        fails the job row too. ``folder``: the result folder's name under the results
        root (default the job id; see radserve.store.leases.result_folder_name)."""
        self.storage.built_from(Path(record.study_path), record.id)
        work = build_work(
            job_id=record.id,
            study_dir=Path(record.study_path),
            resolved=resolved,
            out_dir=self.storage.result_dir(folder or record.id),
            registry=self.catalog.registry,
            sessions=self.catalog.sessions,
            policy=self.policy,
            dicom_results=self.dicom_results(record),
            key_image_scs=self.settings.results.secondary_capture_key_images,
            lineage=self.lineage,
            publish=self.storage if self.storage.enabled else None,
        )
        # the row's arrival and deadline, not the scheduler's own count from now: a job
        # enters the scheduler tens of ms after its row is written, and its misses and
        # risk events were decided on a deadline that far off the one the API shows
        now = dt.datetime.now(dt.UTC)
        request = JobRequest(
            record.id,
            work,
            priority=PriorityClass.parse(str(record.priority_class)),
            age_s=max(0.0, (now - record.arrival).total_seconds()),
            resume=resume,
            deadline_in_s=(record.deadline - now).total_seconds(),
        )
        try:
            with self.admission.entering(slot):
                ticket = self.scheduler.submit(request)
        except RadserveError as exc:
            self.fail(record.id, exc.code, exc.message)
            raise
        return ticket.position

    def fail(self, job_id: str, code: str, message: str) -> JobRecord:
        record = self.store.transition(
            job_id, JobState.FAILED, error_code=code, error_message=message
        )
        self.cache.put(record)
        return record


class Router(Protocol):
    """Chooses the model versions of one study (:class:`ModelLifecycle`)."""

    def needs_routing(self) -> bool: ...

    def route(
        self, resolved: ResolvedPipeline, routing_key: str, priority: PriorityClass | None
    ) -> ResolvedPipeline: ...


def deployment_meta(resolved: ResolvedPipeline) -> dict[str, dict[str, str]]:
    """What a job row keeps of its routing: the role that chose each model's version,
    and the versions to compare it with after delivery."""
    out: dict[str, dict[str, str]] = {}
    if resolved.roles:
        out["deployment"] = dict(resolved.roles)
    if resolved.shadows:
        out["shadows"] = dict(resolved.shadows)
    # written whenever routed, even empty: its presence tells this row's shadows from an
    # older row's, whose one map also held the canary's stable checks
    if resolved.roles:
        out["canary_checks"] = dict(resolved.canary_checks)
    return out


__all__ = [
    "DICOMWEB_SOURCE",
    "Admission",
    "Intake",
    "Origin",
    "Slot",
    "Submission",
    "parse_priority",
    "stream_attributes",
]
