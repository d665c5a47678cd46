"""The console's sign-in sessions and failed sign-ins, shared by every replica on the
database (radserve.console.sessions and radserve.console.limits use them).

A session row is keyed by the SHA-256 of the browser's session id (the id itself is
never stored) and holds the key id or local user, role, CSRF token, expiry and when it
was last used. Reading a session checks its API key in the same query: a revoked or
deleted key's session ends at its next request on any replica. Expired rows are swept
when a session opens; failed sign-ins older than the window when one is counted. A
sign-in attempt is counted as a failure before the key or password is checked, in the
transaction that decided it may be made, and taken back when it succeeds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, replace

from sqlalchemy import delete, func, select, update

from radserve.store.base import StoreBase
from radserve.store.models import ApiKey, ConsoleSession, ConsoleSigninFailure

# the column's length: a longer address (a forwarded header's odd value) is counted by
# its first 64 characters rather than refused by PostgreSQL
_CLIENT_LENGTH = 64


@dataclass(frozen=True)
class SigninAttempt:
    """A sign-in attempt as counted: ``id`` None when refused (``failures`` within the
    window already), else its row, a failure until forgiven; ``failures`` counts it
    too; ``oldest`` is when the window's oldest failure was."""

    id: int | None
    failures: int
    oldest: dt.datetime | None


@dataclass(frozen=True)
class ConsoleSessionRecord:
    """One signed-in browser: whose key (or which local user), which role, until when.
    A local user's session has ``user`` set, ``key_id`` ``user:<name>`` (the actor its
    audit records name) and ``user_check``, a fingerprint of the account it signed in
    with (a changed or removed account ends it)."""

    key_id: str
    key_name: str | None
    role: str
    site: str | None
    submitter: str | None
    csrf: str
    created: dt.datetime
    expires: dt.datetime  # absolute (created + ttl)
    last_seen: dt.datetime
    user: str | None = None
    user_check: str | None = None


def _record(row: ConsoleSession) -> ConsoleSessionRecord:
    return ConsoleSessionRecord(
        key_id=row.key_id,
        key_name=row.key_name,
        role=row.role,
        site=row.site,
        submitter=row.submitter,
        csrf=row.csrf,
        created=row.created,
        expires=row.expires,
        last_seen=row.last_seen,
        user=row.username,
        user_check=row.user_check,
    )


class ConsoleMixin(StoreBase):
    """Console sessions and sign-in failures of :class:`radserve.store.Store`."""

    def open_console_session(
        self, digest: str, session: ConsoleSessionRecord, *, idle: dt.timedelta
    ) -> None:
        """Store ``session`` under ``digest``; sweep the sessions that have ended (past
        their expiry, or unused for ``idle``)."""
        now = session.created
        with self._write(audited=False) as db:
            db.execute(
                delete(ConsoleSession).where(
                    (ConsoleSession.expires <= now) | (ConsoleSession.last_seen <= now - idle)
                )
            )
            db.add(
                ConsoleSession(
                    digest=digest,
                    key_id=session.key_id,
                    key_name=session.key_name,
                    role=session.role,
                    site=session.site,
                    submitter=session.submitter,
                    username=session.user,
                    user_check=session.user_check,
                    csrf=session.csrf,
                    created=session.created,
                    expires=session.expires,
                    last_seen=session.last_seen,
                )
            )

    def console_session(
        self, digest: str, *, now: dt.datetime, idle: dt.timedelta, touch: dt.timedelta
    ) -> ConsoleSessionRecord | None:
        """The live session stored under ``digest``, else None (and an ended one is
        deleted): not past its expiry, used within ``idle``, and opened by a local user
        or an API key that is still active. Its ``last_seen`` is written when it is
        ``touch`` or more old (not at every request: a write per console request)."""
        with self._read() as db:
            found = db.execute(
                select(ConsoleSession, ApiKey.revoked, ApiKey.id)
                .outerjoin(ApiKey, ApiKey.id == ConsoleSession.key_id)
                .where(ConsoleSession.digest == digest)
            ).first()
        if found is None:
            return None
        row, revoked, key = found
        ended = now >= row.expires or now - row.last_seen >= idle
        if ended or (row.username is None and (key is None or revoked is not None)):
            self.close_console_session(digest)
            return None
        session = _record(row)
        if now - row.last_seen >= touch:
            with self._write(audited=False) as db:
                db.execute(
                    update(ConsoleSession)
                    .where(ConsoleSession.digest == digest)
                    .values(last_seen=now)
                )
            session = replace(session, last_seen=now)
        return session

    def close_console_session(self, digest: str) -> None:
        with self._write(audited=False) as db:
            db.execute(delete(ConsoleSession).where(ConsoleSession.digest == digest))

    def console_signin_attempt(
        self, client: str, *, now: dt.datetime, window: dt.timedelta, max_failures: int
    ) -> SigninAttempt:
        """One sign-in attempt from ``client`` at ``now``, if it has had fewer than
        ``max_failures`` failures within ``window``: recorded as a failure at once, in
        the transaction that counted them (a lock per client on PostgreSQL, SQLite's
        write lock from BEGIN), so attempts made at the same time, on any replica, count
        each other before any of them is checked. :meth:`console_signin_forgiven` takes
        back the attempt that succeeds. Failures older than the window are swept."""
        client = client[:_CLIENT_LENGTH]
        with self._write(audited=False) as db:
            if db.get_bind().dialect.name == "postgresql":
                digest = hashlib.sha256(f"console signin\x1f{client}".encode()).digest()
                lock_id = int.from_bytes(digest[:8], "big", signed=True)
                db.execute(select(func.pg_advisory_xact_lock(lock_id)))
            db.execute(delete(ConsoleSigninFailure).where(ConsoleSigninFailure.at <= now - window))
            count, oldest = db.execute(
                select(func.count(), func.min(ConsoleSigninFailure.at)).where(
                    ConsoleSigninFailure.client == client,
                    ConsoleSigninFailure.at > now - window,
                )
            ).one()
            if count >= max_failures:
                return SigninAttempt(None, int(count), oldest)
            row = ConsoleSigninFailure(client=client, at=now)
            db.add(row)
            db.flush()
            return SigninAttempt(row.id, int(count) + 1, oldest or now)

    def console_signin_forgiven(self, attempt_id: int) -> None:
        """The attempt succeeded: it is no failure (the earlier failures stay)."""
        with self._write(audited=False) as db:
            db.execute(delete(ConsoleSigninFailure).where(ConsoleSigninFailure.id == attempt_id))


__all__ = ["ConsoleMixin", "ConsoleSessionRecord", "SigninAttempt"]
