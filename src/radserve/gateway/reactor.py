"""Blocking waits for the two threads pynetdicom runs per association, instead of polls.

pynetdicom (3.0) polls: the DUL thread sleeps 1 ms and then looks at its socket with a
zero timeout; the association thread sleeps 1 ms between looks at its message queue.
Each association wakes its two threads ~2,000 times a second, each wake-up taking the
GIL: 4 idle associations cost the SCP process ~120 CPU-ms a second, 8 ~220
(docs/performance.md, goal 6), and under load the wake-ups take the GIL from the
threads that decode and store instances. Here each thread blocks until it has work:

- the DUL thread in ``select`` on its socket and a wake-up pipe, which is written when
  the association queues a primitive to send (a C-STORE response, a release, an abort)
  or the DUL is killed;
- the association thread on its DIMSE message queue, nudged with pynetdicom's own empty
  item ``(None, None)`` (what its state machine queues on an abort) when the DUL queues
  a primitive for it (release, abort); the peer's release request is noted then
  (:func:`release_requested`).

A connection that ends before its A-ASSOCIATE-RQ arrived (a health check's connect and
close, a reset, a partial request) ends the DUL thread but hands the association thread
nothing: pynetdicom's acceptor would wait ``acse_timeout`` (30 s) for the request, its
connection slot held all that time. When the DUL thread ends without having handed over
an A-ASSOCIATE-RQ, it queues ``None`` for the acceptor, which then takes pynetdicom's own
"no request came" path at once.

Both still wake at least every :data:`POLL_S` for the checks pynetdicom makes on each
loop (its timers, a dead DUL thread, a kill); the DUL thread also ends once its
association thread has ended (pynetdicom stops it first on every path of its own; one
whose association thread died waited in ``select`` for as long as the peer held on).
:func:`wait_instead_of_polling` applies this to one acceptor association before it
starts; :func:`check` refuses to start when an upgrade of pynetdicom moved the internals
it relies on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from pynetdicom.dimse import DIMSEServiceProvider
from pynetdicom.dul import DULServiceProvider
from pynetdicom.pdu_primitives import A_ASSOCIATE, A_RELEASE

from radserve.gateway.cpu_ledger import CpuLedger

logger = logging.getLogger(__name__)
POLL_S = 0.05  # the longest either thread blocks before pynetdicom's own checks


class _Waker:
    """A pipe that wakes one thread from ``select``; :meth:`wake` is safe after close."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()
        self._closed = False

    def fileno(self) -> int:
        return self._read

    def wake(self) -> None:
        with self._lock:
            if not self._closed:
                with contextlib.suppress(BlockingIOError):  # full: it wakes anyway
                    os.write(self._write, b"\0")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read)
                os.close(self._write)


class _CallingQueue(queue.Queue[Any]):
    """A queue that calls ``after_put`` with each item once it is in (a waiter wakes)."""

    def __init__(self, after_put: Callable[[Any], None]) -> None:
        super().__init__()
        self.after_put = after_put

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        self.after_put(item)


class _WaitingDUL(DULServiceProvider):
    """The DUL reactor, blocking on its socket and its waker instead of polling."""

    _waker: _Waker
    _release_requested: bool = False
    _association_requested: bool = False
    _ledger: CpuLedger | None = None

    def _to_user(self, primitive: Any) -> None:
        """The DUL thread handed ``primitive`` to the association thread: wake it."""
        if isinstance(primitive, A_ASSOCIATE):
            self._association_requested = True  # the peer's A-ASSOCIATE-RQ
        elif isinstance(primitive, A_RELEASE) and primitive.result is None:
            self._release_requested = True  # the peer's A-RELEASE-RQ, before any answer
        self.assoc.dimse.msg_queue.put((None, None))

    def _is_transport_event(self) -> bool:
        # pynetdicom's loop looks at the primitives to send first, then here: nothing is
        # left to send, and with no association thread nothing ever will be
        if self._orphaned():
            self._kill_thread = True  # the loop's next check ends the thread
            return False
        # blocking here until the socket is readable or a primitive was queued (the
        # waker) is what the 1 ms sleeps approximated
        if self._wait() and self._process_recv_primitive():
            return True  # its event is queued: the loop acts on it at once
        return super()._is_transport_event()

    def _orphaned(self) -> bool:
        """Whether the association thread (which started this one) has ended. pynetdicom
        stops this thread before its association thread ends on each of its own paths;
        when that thread died instead, this one waited in select for as long as the peer
        held the connection, its socket and wake-up pipe open."""
        assoc = self.assoc
        return assoc.ident is not None and not assoc.is_alive()

    def _wait(self) -> bool:
        """Block until the socket is readable, the waker fires or :data:`POLL_S` passed;
        True when the waker fired. Never blocks where pynetdicom expects an answer now."""
        wrapped = self.socket
        sock = getattr(wrapped, "socket", None)
        if (
            sock is None
            or not getattr(wrapped, "_is_connected", False)
            or self.state_machine.current_state == "Sta13"  # draining before close
            or (isinstance(sock, ssl.SSLSocket) and sock.pending())  # decrypted, buffered
        ):
            return False
        try:
            readable, _, _ = select.select([sock, self._waker], [], [], POLL_S)
        except (OSError, ValueError):
            return False  # pynetdicom's own look at the socket reports the closed connection
        if self._waker in readable:
            self._waker.drain()
            return True
        return False

    def kill_dul(self) -> None:
        super().kill_dul()
        self._waker.wake()

    def run(self) -> None:
        """The thread's life (pynetdicom's reactor), its CPU counted in ``_ledger`` when
        set. ``run``, not ``run_reactor``: the thread's target was bound to pynetdicom's
        own ``run_reactor`` before this class was set, so an override there never ran."""
        start = time.thread_time()
        try:
            super().run()
        except Exception as exc:
            # a peer's PDU pynetdicom fails on while acting on it (a C-STORE-RQ command
            # set without an Affected SOP Instance UID: an AttributeError in its
            # decoding); its state machine logged that, and the thread ended the same
            # way, but with Python's plain-text traceback on stderr (the server's log)
            requestor = getattr(self.assoc, "requestor", None)
            logger.error(
                "association from %s: its receiving thread stopped on what the peer sent "
                "(%s); the association ends",
                getattr(requestor, "address", "an unknown address"),
                type(exc).__name__,
            )
        finally:
            self._waker.close()
            if not self._association_requested:
                # the acceptor waits in receive_pdu for the A-ASSOCIATE-RQ; only this
                # thread puts on the queue, so nothing else is there: None ends the wait
                # now, as its acse_timeout would (pynetdicom then kills the association)
                self.to_user_queue.put(None)
            if self._ledger is not None:
                self._ledger.add("receive", time.thread_time() - start)


class _WaitingDIMSE(DIMSEServiceProvider):
    """The association reactor's look at its message queue blocks (up to POLL_S)."""

    def get_msg(self, block: bool = False) -> Any:
        if block:  # a requestor waiting for a response: pynetdicom's own wait
            return super().get_msg(block)
        try:
            return self.msg_queue.get(timeout=POLL_S)
        except queue.Empty:
            return None, None


def check() -> None:
    """Raise RuntimeError when pynetdicom lacks what this module replaces or calls."""
    needed = {
        DULServiceProvider: ("_is_transport_event", "_process_recv_primitive", "kill_dul"),
        DIMSEServiceProvider: ("get_msg",),
    }
    for owner, names in needed.items():
        missing = [name for name in names if not callable(getattr(owner, name, None))]
        if missing:
            raise RuntimeError(
                f"pynetdicom's {owner.__name__} has no {', '.join(missing)}: the "
                "association reactors cannot wait instead of polling with this version"
            )


def wait_instead_of_polling(assoc: Any, ledger: CpuLedger | None = None) -> None:
    """Make one acceptor association's two threads block instead of poll (call before
    ``assoc.start()``, when nothing is queued yet); ``ledger``: where the DUL thread's
    CPU is counted (``receive``)."""
    dul, dimse = assoc.dul, assoc.dimse
    for name in ("to_provider_queue", "to_user_queue"):
        if not getattr(dul, name).empty():
            raise RuntimeError(f"the association's {name} is not empty: started already?")
    if not isinstance(dimse.msg_queue, queue.Queue):
        raise RuntimeError("pynetdicom's DIMSE message queue is not a queue.Queue")
    dul.__class__ = _WaitingDUL
    dul._waker = waker = _Waker()
    dul._ledger = ledger
    dul.to_provider_queue = _CallingQueue(lambda _primitive: waker.wake())
    dul.to_user_queue = _CallingQueue(dul._to_user)
    dimse.__class__ = _WaitingDIMSE


def release_requested(assoc: Any) -> bool:
    """Whether the peer asked to release ``assoc``: known from when its DUL thread
    received the A-RELEASE-RQ, so before the answer goes out and the peer closes the
    connection (the association thread's EVT_RELEASED may come after that close)."""
    return bool(getattr(assoc.dul, "_release_requested", False))


def release(assoc: Any) -> None:
    """Close the wake-up pipe of an association whose DUL thread is not running."""
    waker = getattr(assoc.dul, "_waker", None)
    if waker is not None:
        waker.close()
