"""Console sign-in sessions: an API key (or a local user's password) exchanged for a
server-side session.

The browser holds only a random session id in an HttpOnly, SameSite=Strict cookie; the
store's ``console_sessions`` table maps the SHA-256 of that id (never the id itself) to
the key's id and role, the session's CSRF token and its expiry
(:mod:`radserve.store.console`). The API key itself is never stored or sent back. The
table is in the database, so every replica on it (and a restarted server) knows every
session: a browser signed in through one replica behind a load balancer is signed in on
all, and a sign-out or a key's revocation ends the session on all at its next request
(every request reads the row; there is no cache to go stale). The idle clock is written
at most every ``touch_s``, and only by what a person does: the live event stream and
the requests the page makes by itself (``X-Console-Background: 1``) leave it, so an
open, unattended tab signs out after ``console.idle_timeout_s`` like a closed one.

CSRF: every state-changing request made with the cookie must carry the session's token
in ``X-CSRF-Token`` (a synchronizer token the page reads from ``GET
/console/api/session``, never from a cookie); SameSite=Strict is the second line.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Callable

from radserve.store import Store
from radserve.store.console import ConsoleSessionRecord as Session
from radserve.store.records import utc_now

COOKIE = "radserve_session"
# its name when it is Secure: a browser takes a ``__Host-`` cookie only from an https
# page, with Path=/ and no Domain, so another application on this host (another port,
# plain http) or a parent domain cannot plant one beside radserve's
SECURE_COOKIE = f"__Host-{COOKIE}"
CSRF_HEADER = "x-csrf-token"
# sent by the page on the requests it makes by itself (a refresh, a poll): they do not
# count as activity; nor does the live event stream (an EventSource sends no header)
BACKGROUND_HEADER = "x-console-background"
EVENTS_PATH = "/console/api/events"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class SessionTable:
    """Sessions by the hash of their id, in the store; ended ones are dropped on use and
    swept when a session opens."""

    def __init__(
        self,
        store: Store,
        *,
        ttl_s: float,
        idle_s: float,
        touch_s: float = 10.0,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.idle_s = idle_s
        self.touch_s = touch_s
        self.clock = clock

    @staticmethod
    def _digest(session_id: str) -> str:
        return hashlib.sha256(session_id.encode()).hexdigest()

    def open(
        self,
        key_id: str,
        role: str,
        *,
        key_name: str | None = None,
        site: str | None = None,
        submitter: str | None = None,
        user: str | None = None,
        user_check: str | None = None,
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
            expires=now + dt.timedelta(seconds=self.ttl_s),
            last_seen=now,
            user=user,
            user_check=user_check,
        )
        self.store.open_console_session(
            self._digest(session_id), session, idle=dt.timedelta(seconds=self.idle_s)
        )
        return session_id, session

    def get(self, session_id: str | None, *, renew: bool = True) -> Session | None:
        """The live session for ``session_id``, else None: ended, signed out, or its API
        key revoked (on any replica). ``renew``: restart its idle clock (a person's
        action; not the page's own background requests, or an open tab never idled)."""
        if not session_id:
            return None
        return self.store.console_session(
            self._digest(session_id),
            now=self.clock(),
            idle=dt.timedelta(seconds=self.idle_s),
            touch=dt.timedelta(seconds=self.touch_s) if renew else dt.timedelta.max,
        )

    def expires_in_s(self, session: Session) -> float:
        return (session.expires - self.clock()).total_seconds()

    def close(self, session_id: str | None) -> None:
        if session_id:
            self.store.close_console_session(self._digest(session_id))


def csrf_ok(session: Session, sent: str | None) -> bool:
    """Whether ``sent`` is the session's CSRF token (constant-time comparison)."""
    return bool(sent) and hmac.compare_digest(session.csrf.encode(), (sent or "").encode())


__all__ = [
    "BACKGROUND_HEADER",
    "COOKIE",
    "CSRF_HEADER",
    "EVENTS_PATH",
    "SAFE_METHODS",
    "SECURE_COOKIE",
    "Session",
    "SessionTable",
    "csrf_ok",
]
