"""Console sign-in sessions: an API key (or a local user's password) exchanged for a
server-side session.

The browser holds only a random session id in an HttpOnly, SameSite=Strict cookie; the
table maps the SHA-256 of that id (never the id itself) to the key's id and role, the
session's CSRF token and its expiry. The API key itself is never stored or sent back.
Sessions live in this process's memory: a restart signs everyone out, which is the safe
direction. A session whose key was revoked stops at the next check (``key_check_s``).

CSRF: every state-changing request made with the cookie must carry the session's token
in ``X-CSRF-Token`` (a synchronizer token the page reads from ``GET
/console/api/session``, never from a cookie); SameSite=Strict is the second line.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from radserve.security.keys import Role

COOKIE = "radserve_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class Session:
    """One signed-in browser: whose key (or which local user), which role, until when.
    A local user's session has ``user`` set and ``key_id`` ``user:<name>`` (the actor
    its audit records name)."""

    key_id: str
    key_name: str | None
    role: Role
    site: str | None
    submitter: str | None
    csrf: str
    created: float
    expires: float  # absolute (created + ttl)
    last_seen: float
    key_checked: float
    user: str | None = None


class SessionTable:
    """Sessions by the hash of their id; thread-safe; expired ones are dropped on use."""

    def __init__(
        self,
        *,
        ttl_s: float,
        idle_s: float,
        key_check_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.idle_s = idle_s
        self.key_check_s = key_check_s
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _digest(session_id: str) -> str:
        return hashlib.sha256(session_id.encode()).hexdigest()

    def open(
        self,
        key_id: str,
        role: Role,
        *,
        key_name: str | None = None,
        site: str | None = None,
        submitter: str | None = None,
        user: str | None = None,
    ) -> tuple[str, Session]:
        """A new session: (the id for the cookie, the session)."""
        now = self.clock()
        session_id = secrets.token_urlsafe(32)
        session = Session(
            key_id=key_id,
            key_name=key_name,
            role=role,
            site=site,
            submitter=submitter,
            csrf=secrets.token_urlsafe(32),
            created=now,
            expires=now + self.ttl_s,
            last_seen=now,
            key_checked=now,
            user=user,
        )
        with self._lock:
            self._drop_expired(now)
            if len(self._sessions) >= _MAX_SESSIONS:  # bounded: the oldest go first
                for digest in sorted(self._sessions, key=lambda d: self._sessions[d].created)[
                    : len(self._sessions) // 10 + 1
                ]:
                    del self._sessions[digest]
            self._sessions[self._digest(session_id)] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session for ``session_id`` (its idle clock restarted), else None."""
        if not session_id:
            return None
        now = self.clock()
        digest = self._digest(session_id)
        with self._lock:
            session = self._sessions.get(digest)
            if session is None:
                return None
            if now >= session.expires or now - session.last_seen >= self.idle_s:
                del self._sessions[digest]
                return None
            session = replace(session, last_seen=now)
            self._sessions[digest] = session
            return session

    def key_check_due(self, session: Session) -> bool:
        return self.clock() - session.key_checked >= self.key_check_s

    def key_checked(self, session_id: str) -> None:
        digest = self._digest(session_id)
        with self._lock:
            session = self._sessions.get(digest)
            if session is not None:
                self._sessions[digest] = replace(session, key_checked=self.clock())

    def close(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._sessions.pop(self._digest(session_id), None)

    def close_key(self, key_id: str) -> None:
        """End every session opened with ``key_id`` (the key was revoked)."""
        with self._lock:
            for digest in [d for d, s in self._sessions.items() if s.key_id == key_id]:
                del self._sessions[digest]

    def _drop_expired(self, now: float) -> None:
        for digest in [
            d
            for d, s in self._sessions.items()
            if now >= s.expires or now - s.last_seen >= self.idle_s
        ]:
            del self._sessions[digest]

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


def csrf_ok(session: Session, sent: str | None) -> bool:
    """Whether ``sent`` is the session's CSRF token (constant-time comparison)."""
    return bool(sent) and hmac.compare_digest(session.csrf.encode(), (sent or "").encode())


__all__ = ["COOKIE", "CSRF_HEADER", "SAFE_METHODS", "Session", "SessionTable", "csrf_ok"]
