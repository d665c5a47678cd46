"""The store's API-key and audit methods (mixed into :class:`radserve.store.Store`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Future

from sqlalchemy import func, select

from radserve.audit.chain import AuditEvent, AuditRecord, VerifyReport, verify_chain
from radserve.audit.events import Action
from radserve.errors import quoted
from radserve.security import keys as keycrypt
from radserve.store import audit as audit_log
from radserve.store.audit_batch import AuditBatcher
from radserve.store.base import StoreBase
from radserve.store.errors import ApiKeyNotFoundError
from radserve.store.models import ApiKey, AuditEntry
from radserve.store.records import ApiKeyRecord, utc_now

logger = logging.getLogger(__name__)


class AccessMixin(StoreBase):
    """API keys (create, revoke, list, verify) and the audit chain (append, verify, read)."""

    # -- API keys -------------------------------------------------------------------

    def create_api_key(
        self,
        *,
        name: str,
        role: keycrypt.Role | str,
        actor_key_id: str | None = None,
        site: str | None = None,
        submitter: str | None = None,
    ) -> tuple[ApiKeyRecord, str]:
        """A new key: its record and the token, which exists only in this return value.
        ``site`` / ``submitter`` scope what it may read under ``security.visibility``."""
        role = keycrypt.Role(role)
        new = keycrypt.generate_key()
        row = ApiKey(
            id=new.key_id,
            name=name,
            role=role.value,
            salt=new.salt,
            hash=new.hash,
            created=utc_now(),
            site=site,
            submitter=submitter,
        )
        with self._write() as session:
            session.add(row)
            session.flush()
            audit_log.append(
                session,
                AuditEvent(
                    action=Action.KEY_CREATED,
                    subject=new.key_id,
                    payload={
                        "name": name,
                        "role": role.value,
                        **({"site": site} if site else {}),
                        **({"submitter": submitter} if submitter else {}),
                    },
                    actor_key_id=actor_key_id,
                ),
            )
            record = _key_record(row)
        logger.info("API key %s created (role %s)", record.id, record.role)
        return record, new.token

    def revoke_api_key(self, key_id: str, *, actor_key_id: str | None = None) -> ApiKeyRecord:
        """Revoke a key (idempotent: revoking a revoked key changes nothing)."""
        with self._write() as session:
            row = session.get(ApiKey, key_id)
            if row is None:
                raise ApiKeyNotFoundError(f"no API key with id {quoted(key_id)}")
            if row.revoked is None:
                row.revoked = utc_now()
                audit_log.append(
                    session,
                    AuditEvent(
                        action=Action.KEY_REVOKED, subject=key_id, actor_key_id=actor_key_id
                    ),
                )
            record = _key_record(row)
        logger.info("API key %s revoked", key_id)
        return record

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        with self._read() as session:
            row = session.get(ApiKey, key_id)
            return _key_record(row) if row is not None else None

    def list_api_keys(self, *, include_revoked: bool = True) -> list[ApiKeyRecord]:
        query = select(ApiKey).order_by(ApiKey.created, ApiKey.id)
        if not include_revoked:
            query = query.where(ApiKey.revoked.is_(None))
        with self._read() as session:
            return [_key_record(row) for row in session.execute(query).scalars()]

    def verify_api_key(self, token: str) -> ApiKeyRecord | None:
        """The active key ``token`` belongs to, or None (malformed, unknown, wrong, revoked)."""
        parsed = keycrypt.parse_token(token)
        key_id, secret = parsed if parsed else ("", "")
        with self._read() as session:
            row = session.get(ApiKey, key_id) if parsed else None
        salt, expected = (row.salt, row.hash) if row else (keycrypt.DUMMY_SALT, keycrypt.DUMMY_HASH)
        matches = keycrypt.secret_matches(secret, salt, expected)
        if row is None or not matches or row.revoked is not None:
            return None
        return _key_record(row)

    # -- audit ----------------------------------------------------------------------

    def append_audit(self, event: AuditEvent) -> AuditRecord:
        """Append one record (config loaded, model changed, ...) to the chain."""
        with self._write() as session:
            return audit_log.append(session, event)

    def submit_audit(self, event: AuditEvent) -> Future[AuditRecord]:
        """Append ``event`` through the store's group commit (:mod:`radserve.store.audit_batch`):
        the future resolves once the record is committed, sharing one commit with the
        events other threads or requests submitted meanwhile. For appends on a hot path
        (every read of patient data); resolves in a writer thread."""
        with self._audit_batcher_lock:
            if self._audit_batcher is None:
                self._audit_batcher = AuditBatcher(self)
            batcher = self._audit_batcher
        return batcher.submit(event)

    def append_audits(self, events: Sequence[AuditEvent]) -> list[AuditRecord]:
        """Append ``events`` in order in one transaction: one commit (one WAL fsync on
        SQLite) for all of them, so a burst of reads is audited at the cost of one.
        All or none: if any fails, none is stored."""
        with self._write() as session:
            return audit_log.append_many(session, events)

    def verify_audit(self) -> VerifyReport:
        """Recompute the whole chain (HMACs with this store's key) and compare it with
        the head, in one snapshot. Checkpoints are checked by :mod:`radserve.audit.seal`."""
        with self._read(snapshot=True) as session:
            head_seq, head_hash = audit_log.head(session)
            return verify_chain(
                audit_log.iter_records(session),
                head_seq=head_seq,
                head_hash=head_hash,
                key=self.audit_key,
            )

    def audit_head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the chain head as the database has it."""
        with self._read() as session:
            return audit_log.head(session)

    def audit_record(self, seq: int) -> AuditRecord | None:
        """The record ``seq`` as stored (None if there is none)."""
        with self._read() as session:
            row = session.get(AuditEntry, seq)
            return audit_log.to_record(row)[1] if row is not None else None

    def audit_chain_key_id(self) -> str | None:
        """The key id of the chain's newest record (None: empty or unkeyed): the key
        every process extending this chain must hold."""
        with self._read() as session:
            seq, _ = audit_log.head(session)
            return audit_log.key_id_at(session, seq)

    def audit_keyed_from(self) -> int:
        """The seq of the first keyed record; the next seq when none is keyed yet."""
        with self._read() as session:
            first = session.execute(
                select(func.min(AuditEntry.seq)).where(AuditEntry.key_id.is_not(None))
            ).scalar_one()
            return int(first) if first is not None else audit_log.head(session)[0] + 1

    def audit_unkeyed_from(self, seq: int) -> int | None:
        """The first unkeyed record at or after ``seq`` (None: all keyed)."""
        with self._read() as session:
            found = session.execute(
                select(func.min(AuditEntry.seq)).where(
                    AuditEntry.seq >= seq, AuditEntry.key_id.is_(None)
                )
            ).scalar_one()
            return int(found) if found is not None else None

    def iter_audit(self, after: int = 0) -> Iterator[AuditRecord]:
        """Every audit record by seq (after ``after``), streamed from one snapshot."""
        with self._read(snapshot=True) as session:
            for _seq, _error, record in audit_log.iter_records(session, after):
                yield record


def _key_record(row: ApiKey) -> ApiKeyRecord:
    return ApiKeyRecord(
        id=row.id,
        name=row.name,
        role=row.role,
        created=row.created,
        revoked=row.revoked,
        site=row.site,
        submitter=row.submitter,
    )
