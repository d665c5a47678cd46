"""The lease keeper: renews this replica's job leases and takes over the jobs of
replicas that died (radserve.store.leases has the rules).

One daemon thread. Renewal runs every third of the lease, so a lease survives two
missed renewals (a database restart, a pause); the take-over poll runs every
``jobs.lease_poll_s`` and only when replicas share the database. A database error is
logged and the next round tries again: a lease that ran out meanwhile is taken over by
another replica, and this replica's writes for that job are then refused (fenced).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from radserve.errors import RadserveError
from radserve.store import Claimed, Lease, Store

logger = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(
        self,
        store: Store,
        lease: Lease,
        *,
        shared: bool,
        poll_s: float,
        on_claimed: Callable[[list[Claimed]], None],
    ) -> None:
        self.store = store
        self.lease = lease
        self.shared = shared
        self.poll_s = poll_s
        self.on_claimed = on_claimed
        self.renew_s = lease.duration.total_seconds() / 3.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held: set[str] = set()  # job ids whose lease the last renewal extended

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="radserve-leases", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        next_renew = next_poll = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_renew:
                next_renew = now + self.renew_s
                self._guarded("renew", self.renew)
            if self.shared and now >= next_poll:
                next_poll = now + self.poll_s
                self._guarded("take over", self.take_over)
            wait = min(next_renew, next_poll if self.shared else next_renew) - time.monotonic()
            self._stop.wait(max(0.05, wait))

    def renew(self) -> None:
        self.held = self.store.renew_leases(self.lease)

    def take_over(self) -> None:
        claimed = self.store.claim_jobs(self.lease, shared=True)
        if claimed:
            self.on_claimed(claimed)

    @staticmethod
    def _guarded(what: str, call: Callable[[], None]) -> None:
        try:
            call()
        except RadserveError as exc:
            logger.warning("leases: %s failed (%s); trying again", what, exc.code)
        except Exception:  # the keeper must outlive any one round
            logger.exception("leases: %s failed", what)


__all__ = ["LeaseKeeper"]
