"""The console's local users (``console.users``) as they are now: re-read from the
settings file when it changes, so removing a user, changing a role or a password hash
takes effect without a restart.

``radserve serve`` names its settings file (``--config`` or ``$RADSERVE_CONFIG``);
:meth:`LocalUsers.current` looks at the file (one ``stat``) and, when its size, time or
inode changed, builds the whole settings again from it and the environment, as at
start, and keeps their ``console.users``. Only the users change: every other setting
still needs a restart. A file that no longer loads (a typo mid-edit) keeps the users
last read and logs why, once per change of the file. A session opened by a user who
is gone or whose account changed ends at its next request
(:func:`radserve.console.auth.current_session`); with several replicas, each re-reads
its own file.

A user's ``site`` and ``submitter`` are its scope under ``security.visibility``, as a
key's are (:meth:`LocalUsers.scopes`): which jobs it sees, and who sees the jobs it
submitted (named ``user:<name>``) and its audit records.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from radserve.config import ConsoleUser, Settings, load_settings
from radserve.errors import RadserveError
from radserve.security.access import USER_PREFIX, Scope, local_actor, local_scopes

logger = logging.getLogger(__name__)


def actor_id(user: ConsoleUser) -> str:
    """The id a local user's sessions, jobs and audit records carry."""
    return local_actor(user.username)


class LocalUsers:
    def __init__(
        self,
        users: tuple[ConsoleUser, ...],
        config_file: Path | None = None,
        load: Callable[[Path], Settings] = load_settings,
    ) -> None:
        self._users = users
        self.config_file = config_file
        self._load = load
        self._seen = self._stat()
        self._lock = threading.Lock()
        self._scopes = (users, local_scopes(users))

    def _stat(self) -> tuple[int, int, int] | None:
        if self.config_file is None:
            return None
        try:
            st = os.stat(self.config_file)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self) -> tuple[ConsoleUser, ...]:
        """The users, re-read first when the settings file changed (call from a
        worker thread: it may read the file)."""
        if self.config_file is None:
            return self._users
        seen = self._stat()
        if seen == self._seen or seen is None:
            return self._users
        with self._lock:
            if seen != self._seen:
                self._seen = seen
                self._reload()
        return self._users

    def scopes(self) -> dict[str, Scope]:
        """The users' scopes (actor id -> site and submitter) as they are now (call
        from a worker thread: it may re-read the file)."""
        users = self.current()
        kept = self._scopes
        if kept[0] is users:
            return kept[1]
        self._scopes = (users, local_scopes(users))
        return self._scopes[1]

    def _reload(self) -> None:
        assert self.config_file is not None
        try:
            users = self._load(self.config_file).console.users
        except RadserveError as exc:
            logger.error(
                "console.users not re-read from %s, the users read before stay: %s",
                self.config_file,
                exc.message,
            )
            return
        before = {u.username for u in self._users}
        after = {u.username for u in users}
        self._users = users
        logger.info(
            "console.users re-read from %s: %d users (%d added, %d removed)",
            self.config_file,
            len(after),
            len(after - before),
            len(before - after),
        )


__all__ = ["USER_PREFIX", "LocalUsers", "actor_id"]
