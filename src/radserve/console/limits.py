"""Failed console sign-ins per client address: after ``max_failures`` within ``window_s``
the client is refused (429, ``Retry-After``) without its key or password being checked,
until the oldest failure leaves the window. Each attempt is counted as a failure before
its key or password is checked, in the transaction that read the count, and taken back
when it succeeds: guesses sent at once count each other, so no more than
``max_failures`` of them are ever checked. Successes do not reset the count (a client
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
from radserve.store.console import SigninAttempt
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

    def take(self, client: str) -> SigninAttempt:
        """An attempt for ``client``, counted as a failure before its key or password is
        checked (:meth:`forgive` takes it back), or refused (``id`` None). Checking
        the count and counting the attempt are one transaction: before 2026-12-06 the
        count was read, the password checked and the failure counted after, so guesses
        sent at once all passed the check (30 at once against a limit of 3: 30 checked)."""
        return self.store.console_signin_attempt(
            client,
            now=self.clock(),
            window=dt.timedelta(seconds=self.window_s),
            max_failures=self.max_failures,
        )

    def retry_after(self, attempt: SigninAttempt) -> float:
        """Seconds until a refused attempt's client may try again: when the oldest
        failure leaves the window."""
        if attempt.oldest is None:
            return 0.0
        until = attempt.oldest + dt.timedelta(seconds=self.window_s)
        return max(0.0, (until - self.clock()).total_seconds())

    def blocks(self, attempt: SigninAttempt) -> bool:
        """Whether ``attempt``, failed, is the failure that blocks its client."""
        return attempt.failures == self.max_failures

    def forgive(self, attempt: SigninAttempt) -> None:
        """The attempt signed in (or the server failed to check it): it is no failure;
        earlier failures still count."""
        if attempt.id is not None:
            self.store.console_signin_forgiven(attempt.id)


__all__ = ["SignInLimiter"]
