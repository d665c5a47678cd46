"""Who may read which job's patient data, and the audit record of each read.

``security.visibility``: ``all`` (any read key reads every job), ``own_submitter`` (a
non-admin key reads the jobs submitted by itself or by a key with the same
``submitter``), ``site`` (by a key with the same ``site``). Admin keys read everything.
A job nobody's key submitted (DICOM gateway) is visible to admins only under a rule. A
job a key may not see answers 404, as if it did not exist. The console's local users
(``console.users``, actor ids ``user:<name>``) carry a ``site`` and ``submitter`` of
their own (:data:`LocalScopes`) and follow the same rule, as readers and as submitters.

Every read of patient data (report, FHIR Bundle, label maps, key images, DICOMweb
results) appends a ``phi.read`` record: who (key id, name, address), which job (and
study, for DICOMweb), what resource, when (the record's time). It is committed before
the answer is sent (reads arriving together share one commit); a read that cannot be
audited is refused (503).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from radserve.audit.chain import AuditEvent, AuditRecord
from radserve.audit.events import Action
from radserve.security.keys import Role, role_allows

if TYPE_CHECKING:
    from radserve.store import ApiKeyRecord, Store

PHI_READ = Action.PHI_READ.value
Visibility = Literal["all", "own_submitter", "site"]
_MAX_CACHED = 10_000


@dataclass(frozen=True)
class Scope:
    """What the visibility rule compares: an actor's site and submitter."""

    site: str | None = None
    submitter: str | None = None


# the console's local users as they are now: actor id (``user:<name>``) -> scope
LocalScopes = Callable[[], Mapping[str, Scope]]
USER_PREFIX = "user:"  # a local user's actor id in audit records and job rows


class _LocalUser(Protocol):
    username: str
    site: str | None
    submitter: str | None


def local_actor(username: str) -> str:
    """The actor id of the console's local user ``username`` (sessions, jobs, audit)."""
    return f"{USER_PREFIX}{username}"


def local_scopes(users: Iterable[_LocalUser]) -> dict[str, Scope]:
    """Actor id -> scope of each local user (``console.users``)."""
    return {local_actor(u.username): Scope(u.site, u.submitter) for u in users}


@dataclass(frozen=True)
class Reader:
    """The calling key, as the visibility rule and the audit need it."""

    key_id: str
    role: Role
    name: str | None = None
    site: str | None = None
    submitter: str | None = None
    client: str | None = None


class ReadAccess:
    """Visibility checks (key scopes cached per process: they do not change after
    creation) and ``phi.read`` audit records. Synchronous: call from a worker thread."""

    def __init__(
        self,
        store: Store,
        visibility: Visibility = "all",
        *,
        audit: Callable[[AuditEvent], Future[AuditRecord]] | None = None,
        local_scopes: LocalScopes | None = None,
    ) -> None:
        """``local_scopes``: the console's local users (their jobs and audit records
        name ``user:<name>``, which is no API key); without it they have no scope."""
        self.store = store
        self.visibility = visibility
        self.local_scopes = local_scopes
        # what commits a phi.read record: the store's group commit, or (an API reader
        # process) the one audit writer of all readers (radserve.api.audit_writer)
        self._audit = audit if audit is not None else store.submit_audit
        self._scopes: dict[str, ApiKeyRecord | None] = {}
        self._lock = threading.Lock()

    def _scope(self, key_id: str) -> ApiKeyRecord | None:
        with self._lock:
            if key_id in self._scopes:
                return self._scopes[key_id]
        record = self.store.get_api_key(key_id)
        with self._lock:
            if len(self._scopes) >= _MAX_CACHED:
                self._scopes.clear()
            self._scopes[key_id] = record
        return record

    def owner_scope(self, actor: str) -> Scope | None:
        """The scope of the key or local user ``actor`` (None: neither is known; a
        removed user is not known)."""
        if actor.startswith(USER_PREFIX):  # no key id has a colon
            return None if self.local_scopes is None else self.local_scopes().get(actor)
        record = self._scope(actor)
        return None if record is None else Scope(record.site, record.submitter)

    def visible(self, reader: Reader, submitted_by: str | None) -> bool:
        """Whether ``reader`` may see a job submitted by the key (or local user)
        ``submitted_by``; the same answer says whether ``reader`` may see who
        ``submitted_by`` is (an audit record's actor)."""
        if self.visibility == "all" or role_allows(reader.role, Role.ADMIN):
            return True
        if submitted_by is None:
            return False
        if submitted_by == reader.key_id:
            return True
        owner = self.owner_scope(submitted_by)
        if owner is None:
            return False
        if self.visibility == "own_submitter":
            return reader.submitter is not None and owner.submitter == reader.submitter
        return reader.site is not None and owner.site == reader.site

    def group_of(self, submitted_by: str | None) -> str:
        """The group of submitters whose non-admin readers see each other's jobs under the
        rule, that of the key (or local user) ``submitted_by``: ``site:<site>``
        (``site``), ``submitter:<name>`` (``own_submitter``), ``actor:<id>`` for a key of
        no such scope (it sees only its own jobs), ``''`` without a rule and for a job no
        key submitted (the DICOM gateway's, which no site sees). A study's results are
        one lineage per group (radserve.service.lineage): a site never supersedes, nor
        names, another site's result."""
        if self.visibility == "all" or submitted_by is None:
            return ""
        owner = self.owner_scope(submitted_by)
        if self.visibility == "own_submitter":
            name = None if owner is None else owner.submitter
            return f"submitter:{name}" if name is not None else f"actor:{submitted_by}"
        site = None if owner is None else owner.site
        return f"site:{site}" if site is not None else f"actor:{submitted_by}"

    def local_members(self, scope: str | None) -> tuple[str, ...]:
        """The local users (actor ids) whose scope under the rule is ``scope``: a
        listing's query counts their jobs with those of the keys of that scope."""
        if scope is None or self.local_scopes is None or self.visibility == "all":
            return ()
        field = "submitter" if self.visibility == "own_submitter" else "site"
        return tuple(
            sorted(a for a, s in self.local_scopes().items() if getattr(s, field) == scope)
        )

    def submit_read(
        self,
        reader: Reader,
        job_id: str,
        resource: str,
        extra: Mapping[str, Any] | None = None,
    ) -> Future[AuditRecord]:
        """Queue the ``phi.read`` record; the future resolves once it is committed (one
        commit shared by the reads that arrive together: :meth:`Store.submit_audit`).
        Answer the read only after that."""
        payload: dict[str, Any] = {"resource": resource, "key_name": reader.name}
        payload.update(extra or {})
        return self._audit(
            AuditEvent(
                action=PHI_READ,
                subject=job_id,
                payload=payload,
                actor_key_id=reader.key_id,
                client_address=reader.client,
            )
        )


__all__ = [
    "PHI_READ",
    "USER_PREFIX",
    "LocalScopes",
    "ReadAccess",
    "Reader",
    "Scope",
    "Visibility",
    "local_actor",
    "local_scopes",
]
