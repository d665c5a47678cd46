"""Failed console sign-ins per client address: after ``max_failures`` within ``window_s``
the client is refused (429, ``Retry-After``) without its key or password being checked,
until the oldest failure leaves the window. Successes do not reset the count (a client
holding one valid account cannot use it to keep guessing another's password).

Per address, not per user name: counting per name would let anyone lock a radiologist
out of the wall screen by typing their name. The failures are rows in the store
(``console_signin_failures``, :mod:`radserve.store.console`), so every replica on the
database counts the same ones: N replicas behind a load balancer give an attacker the
same attempts as one, and a restart forgets nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from radserve.store import Store
from radserve.store.records import utc_now


class SignInLimiter:
    def __init__(
        self,
        store: Store,
        *,
        max_failures: int,
        window_s: float,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        self.store = store
        self.max_failures = max_failures
        self.window_s = window_s
        self.clock = clock

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        now, window = self.clock(), dt.timedelta(seconds=self.window_s)
        count, oldest = self.store.console_signin_failures(client, now=now, window=window)
        if count < self.max_failures or oldest is None:
            return None
        return max(0.0, (oldest + window - now).total_seconds())

    def failed(self, client: str) -> bool:
        """Count a failure; True when it is the one that blocks the client."""
        window = dt.timedelta(seconds=self.window_s)
        count = self.store.console_signin_failed(client, now=self.clock(), window=window)
        return count == self.max_failures


__all__ = ["SignInLimiter"]
