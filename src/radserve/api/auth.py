"""API-key authentication and role checks: one dependency per role.

A key arrives as ``Authorization: Bearer rsk_...`` or ``X-API-Key: rsk_...``. A verified
key is remembered for ``ttl_s`` seconds (keyed by the SHA-256 of the token, never the
token itself) so a status poll costs no database round trip; a revoked key therefore
stops working within ``ttl_s``. Unknown keys are not remembered.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from radserve.api.errors import ForbiddenError, UnauthenticatedError
from radserve.errors import RadserveError, quoted
from radserve.loop_failures import LoopFailures
from radserve.security.access import USER_PREFIX, ReadAccess, Reader
from radserve.security.keys import Role, parse_token, role_allows
from radserve.store import (
    ApiKeyRecord,
    DatabaseUnavailableError,
    JobNotFoundError,
    JobRecord,
    Store,
)
from radserve.store.jobs import VisibleTo
from radserve.store.results import ResultInstanceRecord
from radserve.store.waiting import waiting_for_store

logger = logging.getLogger(__name__)

# documented in the OpenAPI schema (see radserve.api.app) and read by token_of()
SECURITY_SCHEMES = {
    "HTTPBearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key: `Authorization: Bearer rsk_...`",
    },
    "APIKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
}
_MAX_CACHED = 10_000


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's id and role, and the client address (audited); the
    key's name, site and submitter (the visibility rule)."""

    key_id: str
    role: Role
    client: str | None
    name: str | None = None
    site: str | None = None
    submitter: str | None = None
    # signed in through the console (a session cookie), not an API key: such a principal
    # reads patient identifiers only when its role is in ``console.phi_roles``
    session: bool = False

    def allows(self, role: Role) -> bool:
        return role_allows(self.role, role)

    @property
    def reader(self) -> Reader:
        return Reader(self.key_id, self.role, self.name, self.site, self.submitter, self.client)


class KeyVerifier:
    """Token -> key record, with a short memory of verified tokens."""

    def __init__(
        self,
        store: Store,
        *,
        ttl_s: float = 10.0,
        wait_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        # a database outage is waited out this long (server.store_wait_s), then 503
        self.wait_s = wait_s
        self.clock = clock
        self._known: dict[str, tuple[float, ApiKeyRecord]] = {}
        self._checking: dict[tuple[str, bool], asyncio.Future[ApiKeyRecord | None]] = {}
        self._lock = threading.Lock()
        # the checks that do not wait (a probe's, every few seconds) log an outage once
        # when it starts and once when a check answers again, not once per probe
        self._probe_outage = LoopFailures(
            logger, "API key checks without a wait (/readyz)", clock=clock
        )

    def remembered(self, token: str) -> ApiKeyRecord | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            hit = self._known.get(digest)
        if hit is None or hit[0] < self.clock():
            return None
        return hit[1]

    async def checked(self, token: str, *, wait: bool = True) -> ApiKeyRecord | None:
        """:meth:`verify` in a worker thread, once for all the requests that ask about
        the same token while it runs: when a poller's memory runs out, its many
        connections miss together, and each used to read the store (on the running
        loop; a cancelled caller leaves the check to the others)."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        running = self._checking.get((digest, wait))
        if running is None:
            running = asyncio.ensure_future(run_in_threadpool(self.verify, token, wait=wait))
            self._checking[digest, wait] = running
            running.add_done_callback(lambda _: self._checking.pop((digest, wait), None))
        return await asyncio.shield(running)

    def verify(self, token: str, *, wait: bool = True) -> ApiKeyRecord | None:
        """Check the token against the store (a database read; call from a thread);
        ``wait`` False: one try, :class:`DatabaseUnavailableError` at once if it fails."""
        if wait:
            record = waiting_for_store(
                lambda: self.store.verify_api_key(token), self.wait_s, what="an API key's check"
            )
        else:
            try:
                record = self.store.verify_api_key(token)
            except DatabaseUnavailableError as exc:
                with self._lock:
                    self._probe_outage.failed(exc)
                raise
        if parse_token(token) is not None:  # a malformed one is refused without the database
            with self._lock:
                self._probe_outage.succeeded()
        if record is not None:
            digest = hashlib.sha256(token.encode()).hexdigest()
            with self._lock:
                if len(self._known) >= _MAX_CACHED:
                    self._known.clear()
                self._known[digest] = (self.clock() + self.ttl_s, record)
        return record


def token_of(request: Request) -> str | None:
    """The key sent as ``X-API-Key`` or ``Authorization: Bearer``, if any. Both, naming
    different keys, are refused (401): before session 42 ``X-API-Key`` won, so a client
    behind a proxy that sets ``Authorization`` for it could act as another key by adding
    its own ``X-API-Key``, and a wrong Bearer key went unnoticed beside a valid one."""
    headers = request.headers
    api_key = headers.get("x-api-key") or None
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    bearer = (credentials.strip() or None) if scheme.lower() == "bearer" else None
    if api_key and bearer and api_key != bearer:
        raise UnauthenticatedError(
            "the request names two different API keys (Authorization: Bearer and "
            "X-API-Key): send one"
        )
    return api_key or bearer


async def _key_principal(request: Request, token: str | None, *, wait: bool) -> Principal:
    if not token:
        raise UnauthenticatedError(
            "this endpoint needs an API key: send `Authorization: Bearer <key>` or "
            "`X-API-Key: <key>` (create one with `radserve keys create`)"
        )
    verifier: KeyVerifier = request.app.state.keys
    record = verifier.remembered(token)
    if record is None:
        record = await verifier.checked(token, wait=wait)
    if record is None:
        raise UnauthenticatedError("the API key is not valid (unknown, malformed or revoked)")
    return Principal(
        record.id,
        Role(record.role),
        request.client.host if request.client else None,
        name=record.name,
        site=record.site,
        submitter=record.submitter,
    )


def require(role: Role, *, wait: bool = True) -> Callable[..., Awaitable[Principal]]:
    """A dependency that admits keys whose role grants ``role``.

    It reads the headers itself (one dependency, no sub-dependencies: status polls are
    the hot path); :data:`SECURITY_SCHEMES` documents them in the OpenAPI schema.
    ``wait`` False: a key that must be checked while the database does not answer
    raises :class:`DatabaseUnavailableError` at once (logged once per outage, not per
    probe) instead of :class:`StoreWaitExceededError` after
    ``server.store_wait_s`` (a probe must answer fast)."""

    async def dependency(request: Request) -> Principal:
        token = token_of(request)
        # no key: a console session cookie, when the console is installed (its CSRF
        # check for state-changing requests included); see radserve.console.auth
        resolver = getattr(request.app.state, "session_principal", None)
        principal = await resolver(request) if not token and resolver is not None else None
        if principal is None:
            principal = await _key_principal(request, token, wait=wait)
        if not principal.allows(role):
            raise ForbiddenError(
                f"this endpoint needs a key with the {role.value} role; this key has "
                f"{principal.role.value}"
            )
        return principal

    dependency.__name__ = f"require_{role.value}"
    return dependency


def read_access(request: Request) -> ReadAccess:
    """The app's :class:`ReadAccess` (built on first use from the service's settings;
    with the console installed, its local users' scopes as they are now)."""
    state = request.app.state
    access: ReadAccess | None = getattr(state, "read_access", None)
    if access is None:
        service = state.service
        users = getattr(state, "console_users", None)
        access = ReadAccess(
            service.store,
            service.settings.security.visibility,
            local_scopes=None if users is None else users.scopes,
        )
        state.read_access = access
    return access


def restricted(request: Request, principal: Principal) -> bool:
    """Whether a visibility rule limits what ``principal`` sees (not ``all``, no admin)."""
    return read_access(request).visibility != "all" and not principal.allows(Role.ADMIN)


def visible_to(request: Request, principal: Principal) -> VisibleTo | None:
    """The visibility rule for ``principal`` as a listing's query filter (None: it sees
    every job): a list filtered after its query held short pages, and its cursor named
    jobs the key may not see. Call from a worker thread (a local user's scopes may be
    re-read from the settings file)."""
    access = read_access(request)
    if access.visibility == "all" or principal.allows(Role.ADMIN):
        return None
    scope = principal.submitter if access.visibility == "own_submitter" else principal.site
    return VisibleTo(access.visibility, principal.key_id, scope, access.local_members(scope))


def actor_visible(request: Request, principal: Principal, actor: str | None) -> bool:
    """Whether ``principal`` may be told who ``actor`` (a key id or ``user:<name>``) is:
    the visibility rule for jobs, applied to whoever acted (an audit record's actor, a
    model deployment's): a site's reader sees its own site's keys and users, not another
    site's or an admin key's. A name that is neither a key nor a local user (the
    guardrails' ``radserve-guardrail``) names nobody and is shown. Call from a worker
    thread."""
    if actor is None or not restricted(request, principal):
        return True
    access = read_access(request)
    if access.visible(principal.reader, actor):
        return True
    return access.owner_scope(actor) is None and not actor.startswith(USER_PREFIX)


def shown_actor(request: Request, principal: Principal, actor: str | None) -> str | None:
    """``actor`` if :func:`actor_visible`, else None (call from a worker thread)."""
    return actor if actor_visible(request, principal, actor) else None


def job_visible(request: Request, principal: Principal, job_id: str | None) -> bool:
    """Whether ``principal`` may see the job ``job_id`` (one a job or a report names:
    the earlier job whose result a cached job reused). A job that does not exist is
    not visible. Call from a worker thread."""
    if job_id is None or not restricted(request, principal):
        return True
    jobs = request.app.state.service.jobs
    record = jobs.cached(job_id)
    if record is None:
        try:
            record = jobs.get(job_id)
        except JobNotFoundError:
            return False
    return read_access(request).visible(principal.reader, record.api_key_id)


def result_reader_job(request: Request, principal: Principal, job_id: str) -> JobRecord | None:
    """The job through which ``principal`` reads DICOM results indexed under ``job_id``:
    that job if it may see it, else the oldest job it may see that was answered from
    that job's result (a site's re-sent study reuses another site's result, indexed
    under the job that made it), else None. Call from a worker thread."""
    jobs = request.app.state.service.jobs
    try:
        record = jobs.get(job_id)
    except JobNotFoundError:
        return None
    if not restricted(request, principal):
        return record
    access = read_access(request)
    if access.visible(principal.reader, record.api_key_id):
        return record
    for copy in jobs.store.cached_copies(job_id):
        if access.visible(principal.reader, copy.api_key_id):
            return copy
    return None


def submitter_sees(request: Request, principal: Principal) -> Callable[[str | None], bool] | None:
    """``Origin.sees`` for a submission by ``principal``: whether it may see a job
    submitted by a given key or user (under a visibility rule; None: no rule limits it,
    every earlier result may answer it). Called from the intake's worker thread."""
    if not restricted(request, principal):
        return None
    access, reader = read_access(request), principal.reader
    return lambda actor: access.visible(reader, actor)


def source_visible(request: Request, principal: Principal, job: JobRecord) -> bool:
    """Whether ``principal`` may be shown ``job.cached_from``: the earlier job whose
    result answered ``job`` may belong to another site (call from a worker thread)."""
    return job_visible(request, principal, job.cached_from)


async def shows_source(request: Request, principal: Principal, job: JobRecord) -> bool:
    """:func:`source_visible` on the event loop: no worker thread unless a rule applies
    and the job was answered from the cache (a status poll stays on the loop)."""
    if job.cached_from is None or not restricted(request, principal):
        return True
    return await run_in_threadpool(source_visible, request, principal, job)


async def check_visible(request: Request, principal: Principal, job: JobRecord) -> None:
    """404 (as if it did not exist) for a job the key may not see."""
    access = read_access(request)
    if access.visibility == "all" or principal.allows(Role.ADMIN):
        return
    if not await run_in_threadpool(access.visible, principal.reader, job.api_key_id):
        raise JobNotFoundError(f"no job with id {quoted(job.id)}")


def check_phi_identifiers(request: Request, principal: Principal, what: str) -> None:
    """403 for a console session whose role is not in ``console.phi_roles`` asking for
    ``what``: a download that names the patient (a FHIR Patient, a DICOM object's
    patient module). The study view hides those details from such roles; the same
    session must not fetch them another way. API keys keep their documented access."""
    if not principal.session:
        return
    service = getattr(request.app.state, "service", None)
    roles = tuple(service.settings.console.phi_roles) if service is not None else ()
    if principal.role.value in roles:
        return
    raise ForbiddenError(
        f"{what} names the patient: console sessions get it only with a role in "
        f"console.phi_roles ({', '.join(roles) or 'none'}); this session's role is "
        f"{principal.role.value}"
    )


async def read_unless_outage(request: Request) -> Principal | None:
    """:data:`require_read` without waiting for the database: None when the key could
    not be checked because the database does not answer (``/readyz`` then answers only
    what needs no key; a bad key is still refused whenever the database answers)."""
    try:
        return await _read_at_once(request)
    except DatabaseUnavailableError:
        return None


class AuditUnavailableError(RadserveError):
    """A read of patient data could not be audited, so it is not answered."""

    code = "store_error"
    retryable = True


async def audited_read(
    request: Request,
    principal: Principal,
    job: JobRecord,
    resource: str,
    extra: dict[str, str] | None = None,
) -> None:
    """Visibility check, then the ``phi.read`` audit record, before any byte is sent."""
    await check_visible(request, principal, job)
    try:
        # no worker-thread hop: the store's audit writer commits this record together
        # with the other reads' and resolves the future on this loop
        await asyncio.wrap_future(
            read_access(request).submit_read(principal.reader, job.id, resource, extra)
        )
    except RadserveError as exc:
        raise AuditUnavailableError(
            f"the read could not be audited ({exc.code}); try again"
        ) from exc


async def audited_results(
    request: Request,
    principal: Principal,
    records: Sequence[ResultInstanceRecord],
    resource: str,
    study: str,
) -> list[ResultInstanceRecord]:
    """Of DICOMweb result instances (``records``, of a study, series or instance), those
    of the jobs ``principal`` may read (none: 404, the same answer as unknown UIDs), each
    job's read audited. Before session 42 one job it could not see failed the whole
    request: a second site sending the same study made every other reader's study-level
    retrieve 404 (while QIDO still listed the study: an oracle for "another site has
    results here")."""
    readable: set[str] = set()
    for job_id in sorted({r.job_id for r in records}):
        job = await run_in_threadpool(result_reader_job, request, principal, job_id)
        if job is None:
            continue
        await audited_read(request, principal, job, resource, {"study": study})
        readable.add(job_id)
    if not readable:
        from radserve.gateway.dicomweb.wado import DicomObjectNotFoundError

        raise DicomObjectNotFoundError("no radserve result with these UIDs") from None
    return [r for r in records if r.job_id in readable]


require_read = require(Role.READ)
_read_at_once = require(Role.READ, wait=False)
require_submit = require(Role.SUBMIT)
require_admin = require(Role.ADMIN)

__all__ = [
    "SECURITY_SCHEMES",
    "KeyVerifier",
    "Principal",
    "actor_visible",
    "audited_read",
    "audited_results",
    "check_phi_identifiers",
    "check_visible",
    "job_visible",
    "read_access",
    "read_unless_outage",
    "require",
    "require_admin",
    "require_read",
    "require_submit",
    "restricted",
    "result_reader_job",
    "shown_actor",
    "shows_source",
    "source_visible",
    "submitter_sees",
    "token_of",
    "visible_to",
]
