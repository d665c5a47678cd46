"""A running server whose database a newer radserve migrated beneath it stops.

At start a server refuses a schema revision other than its code's
(:func:`radserve.store.migrate.upgrade`, ``schema_not_current``): a server never runs on
a schema newer than its own. A server already running when a newer one upgrades the
database (a rolling upgrade that did not stop the older replicas first) went on as if
nothing happened: its writes follow a schema it does not know. The lease keeper
(:mod:`radserve.service.leases`) reads the revision with each renewal; once it is not
this code's, the server

- renews no lease any more, so a replica of the newer radserve takes its unfinished
  jobs over after their lease (the fence voids whatever this one still writes of them);
- hands out no new work (the scheduler's hold :data:`HELD_REASON`: the jobs' status names
  it in ``waiting_for``) and refuses new studies (503 ``schema_not_current``,
  :class:`SchemaChangedError`);
- is not ready (``/readyz`` names the revisions), and
- stops: ``radserve serve`` ends cleanly with exit code 2 and the same one line as a
  refused start, so a supervisor that restarts it gets the start's refusal.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from radserve.errors import RadserveError
from radserve.store.base import unavailable_why
from radserve.store.errors import DatabaseUnavailableError
from radserve.store.migrate import current_revision, head_revision

HELD_REASON = "schema_not_current"  # the scheduler's hold (a metric label, waiting_for)


class SchemaChangedError(RadserveError):
    """The database was migrated beneath this running server: it takes no new work
    (another replica, of the newer radserve, does)."""

    code = "schema_not_current"
    retryable = True
    retry_after = 10  # seconds: the load balancer has taken this replica out by then


class SchemaWatch:
    """Reads the database's schema revision; remembers the first change seen."""

    def __init__(self, engine: Engine, *, expected: str | None = None) -> None:
        self.engine = engine
        self.expected = expected if expected is not None else head_revision()
        self.changed: str | None = None  # what /readyz and the log say, once seen

    def check(self) -> str | None:
        """The change, when the revision is not this code's and no change was
        :meth:`publish`-ed (then None: it is reported once). A database that does not
        answer is the store's outage (:class:`DatabaseUnavailableError`): the renewal's
        round fails and is tried again, logged as an outage is (the driver's error
        escaped as an internal one, with a traceback, once per outage)."""
        if self.changed is not None:
            return None
        try:
            found = current_revision(self.engine)
        except (sa_exc.OperationalError, sa_exc.TimeoutError) as exc:
            why = (
                unavailable_why(exc) if isinstance(exc, sa_exc.DBAPIError) else "no free connection"
            )
            raise DatabaseUnavailableError(f"database unavailable: {why}") from exc
        if found == self.expected:
            return None
        return (
            f"the database schema changed beneath this server: it holds revision {found}, "
            f"this radserve runs on {self.expected} (a newer radserve migrated it?); this "
            "server takes no new work and stops (a server never runs on a schema newer than "
            "its own): run the newer radserve here"
        )

    def publish(self, why: str) -> None:
        """Make the change what /readyz says, once the server acted on it (its work held,
        its stop asked for): a readiness answer naming the change never comes from a
        server that still admits studies or hands out work."""
        self.changed = why


__all__ = ["HELD_REASON", "SchemaChangedError", "SchemaWatch"]
