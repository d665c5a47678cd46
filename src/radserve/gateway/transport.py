"""The SCP's TCP edge: which connections get a thread, how long one may take.

pynetdicom's :class:`ThreadedAssociationServer` does the TLS handshake inside its accept
loop (one silent client stops every other connection) and reads each PDU with blocking
``recv`` calls and no deadline (a client that sends part of a PDU and goes quiet holds
its association slot forever: 21 such clients locked every PACS out). Here:

- :class:`GatewayServer` accepts only; each connection's own thread does the TLS
  handshake under a timeout (a connection closed with nothing sent, as a TCP health
  check does, is logged at DEBUG only; one that opens with a plain A-ASSOCIATE-RQ, a
  sender not set up for TLS, is answered A-ASSOCIATE-RJ in the clear with nothing read
  past its request, and closed: :func:`refuse_plain_request`);
- :class:`Admission` decides at accept, before any thread or byte is spent, whether a
  connection may have a slot: at most ``max_associations_per_host`` per source address,
  and ``reserved_for_peers`` of the ``max_associations`` slots only for the addresses
  of allowed peers, so strangers cannot take the last slot; a refused connection is
  answered A-ASSOCIATE-RJ rejected-transient, local-limit-exceeded (what pynetdicom
  answers past its own association limit: a sender retries later and says why) and
  closed at once (over TLS, closed only: nothing is readable before the handshake); a
  slot is given back when its connection's thread ends, at once for a connection that
  closes before its A-ASSOCIATE-RQ arrived (:mod:`radserve.gateway.reactor`);
- :class:`BoundedSocket` reads each PDU under a deadline (``pdu_timeout_s``) and refuses
  one announcing more than ``max_pdu_bytes`` before reading it, so nothing is allocated
  for a claimed 4 GiB PDU; both end the connection with one log line;
- ``limit_store`` (:class:`~radserve.gateway.receive_limit.StoreLimit`) bounds each
  C-STORE's data set while it arrives; a partial one is removed when the connection ends.

With several receiving processes (:mod:`radserve.gateway.receivers`) the parent's
:class:`GatewayServer` accepts and admits as above, then hands each admitted socket over
(``hand_over``) instead of starting a thread; a receiving process runs it in a
:class:`HandedServer`, a server with no listening socket of its own.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from pynetdicom import evt
from pynetdicom.association import Association
from pynetdicom.transport import AssociationSocket, RequestHandler, ThreadedAssociationServer

from radserve.gateway import reactor
from radserve.gateway.config import normalise_address
from radserve.gateway.cpu_ledger import CpuLedger
from radserve.gateway.receive_limit import StoreLimit

logger = logging.getLogger(__name__)

# A-ASSOCIATE-RJ (PS3.8 9.3.4): PDU type 3, length 4; result 2 rejected-transient,
# source 3 service-provider (presentation related), reason 2 local-limit-exceeded
BUSY_REJECT = bytes([0x03, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x02, 0x03, 0x02])
# A-ASSOCIATE-RJ: result 1 rejected-permanent, source 1 service-user, reason 1 no reason
# given: the answer, in the clear, to a plain A-ASSOCIATE-RQ on the TLS port. Permanent:
# the same request never succeeds (a transient one makes a PACS retry it for ever); no
# reason given: none of PS3.8's reasons says "use TLS", and "calling AE title not
# recognised" would be untrue (the title was never checked) and send the engineer to the
# AE configuration. The SCP's log says why.
PLAIN_ON_TLS_REJECT = bytes([0x03, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x01, 0x01, 0x01])
# a TLS record of content type handshake (RFC 8446 5.1): what a TLS client sends first;
# no PDU type (PS3.8 9.3.1) is 0x16, so a plain port may tell it from a DICOM request
TLS_HANDSHAKE_RECORD = b"\x16"
A_ASSOCIATE_RQ = b"\x01"
# an A-ASSOCIATE-RQ's fixed fields after its 6-byte header (PS3.8 9.3.2): protocol
# version, reserved, called AE title, calling AE title (bytes 20-35), 32 reserved
_RQ_FIXED_BYTES = 68
_CALLING_AE = slice(20, 36)


class Admission:
    """Connection slots per source address, with some kept for known peers. Thread-safe:
    :meth:`admit` runs in the accept loop, :meth:`release` in connection threads."""

    def __init__(
        self,
        *,
        total: int,
        per_host: int,
        reserved: int,
        known_addresses: Iterable[str],
    ) -> None:
        self.total = total
        self.per_host = per_host
        self.known = frozenset(normalise_address(a) for a in known_addresses)
        # no known address (open allow-list, or only "*" hosts): nothing to reserve for
        self.reserved = reserved if self.known else 0
        self._open: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self._lock = threading.Lock()

    def admit(self, address: str) -> bool:
        host = normalise_address(address)
        with self._lock:
            in_use = sum(self._open.values())
            strangers = sum(n for a, n in self._open.items() if a not in self.known)
            if self._open[host] >= self.per_host:
                reason = f"{self.per_host} connections from this address already"
            elif in_use >= self.total:
                reason = f"all {self.total} association slots in use"
            elif host not in self.known and strangers >= self.total - self.reserved:
                reason = f"the slots left are reserved for allowed peers ({self.reserved})"
            else:
                self._open[host] += 1
                return True
            self._refused[host] += 1
            refused = self._refused[host]
        # one line for the first refusal of an address and every 100th after it
        if refused % 100 == 1:
            logger.warning("connection from %s closed: %s (%d so far)", host, reason, refused)
        return False

    def release(self, address: str) -> None:
        host = normalise_address(address)
        with self._lock:
            self._open[host] -= 1
            if self._open[host] <= 0:
                del self._open[host]

    def open_connections(self) -> dict[str, int]:
        with self._lock:
            return dict(self._open)


class BoundedSocket(AssociationSocket):
    """pynetdicom's socket with a deadline on each PDU read and a cap on its size.

    pynetdicom reads a PDU as ``recv(6)`` (type + length) then ``recv(length)``; a short
    read makes it close the connection (event 17) with one error line, so giving up is
    returning what arrived."""

    pdu_timeout_s: float = 30.0
    max_pdu_bytes: int = 1024**2

    def recv(self, nr_bytes: int) -> bytearray:
        sock = self.socket
        data = bytearray()
        if sock is None:
            return data
        peer = self._peer()
        if nr_bytes > self.max_pdu_bytes:
            logger.warning(
                "connection from %s closed: a PDU of %d bytes announced (limit %d)",
                peer,
                nr_bytes,
                self.max_pdu_bytes,
            )
            self._give_up()
            return data
        deadline = time.monotonic() + self.pdu_timeout_s
        first = not getattr(self, "_read_before", False)
        self._read_before = True
        while len(data) < nr_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logger.warning(
                    "connection from %s closed: no complete PDU within %.0f s (%d of %d bytes)",
                    peer,
                    self.pdu_timeout_s,
                    len(data),
                    nr_bytes,
                )
                self._give_up()
                return data
            try:
                sock.settimeout(remaining)
                chunk = sock.recv(min(nr_bytes - len(data), 65536))
            except TimeoutError:
                continue
            except OSError:  # reset by the peer, TLS error: a short read ends it
                return data
            if not chunk:
                return data
            if first and not data and chunk[:1] == TLS_HANDSHAKE_RECORD:
                logger.warning(
                    "connection from %s closed: it began a TLS handshake on this plain-TCP "
                    "port: configure the sender without TLS, or this gateway with gateway.tls",
                    peer,
                )
                self._give_up()
                return data
            data.extend(chunk)
        # sends (answers) are bounded too: a peer that never reads cannot hold a thread
        sock.settimeout(self.pdu_timeout_s)
        return data

    def _peer(self) -> str:
        try:
            return str(self.assoc.requestor.address)
        except Exception:
            return "?"

    def _give_up(self) -> None:
        """Close now: pynetdicom's reactor then sees no more data (no busy loop)."""
        self.close()


def _check_conversion(dul: Any) -> None:
    """Make a PDU that decodes but cannot become a primitive (e.g. presentation context
    ID 0) an invalid PDU (event 19: A-ABORT) at decoding, where pynetdicom handles
    errors; left to its state machine, it kills the DUL thread with a traceback.

    The primitive made here is the one the state machine gets (its ``to_primitive``
    returns it): converted twice, a PACS's A-ASSOCIATE-RQ proposing ~120 contexts cost
    twice its UID checks, and every P-DATA-TF PDU twice its conversion."""
    decode = dul._decode_pdu

    def decode_and_check(bytestream: bytearray) -> Any:
        pdu, event = decode(bytestream)
        primitive = pdu.to_primitive()
        pdu.to_primitive = lambda: primitive  # each PDU is converted once, by one caller
        return pdu, event

    dul._decode_pdu = decode_and_check


class _SharedContexts(list[Any]):
    """The server's presentation contexts, one list for all its associations.

    pynetdicom deep-copies them for each association it accepts (171 contexts, 2,382
    transfer syntaxes: ~21 CPU-ms, ~1 CPU-ms an instance when 8 associations bring 19
    instances each), though negotiation only reads them
    (``pynetdicom.presentation.negotiate_as_acceptor``); nothing in radserve changes
    them once the server is made."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharedContexts:
        return self


# A-ASSOCIATE-RJ for a request that cannot be negotiated (pynetdicom failed on it, e.g. a
# presentation context without a transfer syntax): rejected-permanent (the same request
# fails again), service-provider (ACSE related), no reason given
_REJECT_UNNEGOTIABLE = (0x01, 0x02, 0x01)
# A-ABORT source: service provider (the association failed here, not at the user's wish)
_ABORT_PROVIDER = 0x02
# how long a failed association waits for its answer to go out and the peer to close
# before its connection is closed anyway (a peer that holds it gains nothing)
ANSWER_GRACE_S = 2.0
# DUL states (PS3.8 9.2): awaiting the local answer to an A-ASSOCIATE-RQ; the states
# where an A-ABORT may be sent (established, releasing: PS3.8 table 9-10, Evt15)
_AWAITING_ANSWER = "Sta3"
_ABORTABLE = frozenset(f"Sta{n}" for n in range(5, 13))


class _GuardedAssociation(Association):
    """pynetdicom's acceptor association, whose thread never dies unanswered.

    An exception in the association thread (pynetdicom's ``negotiate_as_acceptor``
    raised IndexError on a presentation context without a transfer syntax) ended the
    thread with a traceback and nothing sent: the peer waited, and the DUL thread, its
    wake-up pipe and the socket stayed for as long as the peer held the connection (366
    such connections took a receiver to 1,022 open files). Here the failure is one log
    line, the peer is answered A-ASSOCIATE-RJ (rejected-permanent) when its request was
    not answered yet, else A-ABORT, and the connection's thread
    (:func:`_close_association`) then stops the DUL thread and closes the socket."""

    failure: str | None = None

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # peer-controlled input: one line, never a traceback
            self.failure = type(exc).__name__
            self._answer_failure()

    def _answer_failure(self) -> None:
        dul = self.dul
        state = dul.state_machine.current_state if dul.is_alive() else "Sta1"
        answer = "nothing (the connection had ended)"
        try:
            if state == _AWAITING_ANSWER:
                self.acse.send_reject(*_REJECT_UNNEGOTIABLE)
                answer = "A-ASSOCIATE-RJ (rejected-permanent)"
            elif state in _ABORTABLE:
                self.acse.send_abort(_ABORT_PROVIDER)
                answer = "A-ABORT"
        except Exception as exc:  # the DUL is gone: closing the connection is the answer
            answer = f"nothing ({type(exc).__name__})"
        calling = str(getattr(self.requestor.primitive, "calling_ae_title", "") or "").strip()
        logger.warning(
            "association from %s at %s failed while %s (%s): answered %s and closed",
            f"AE {calling!r}" if calling else "a peer",
            getattr(self.requestor.address_info, "address", "?"),
            "negotiating" if state == _AWAITING_ANSWER else "running",
            self.failure,
            answer,
        )
        # the answer out, and the peer's close (a peer that reads it closes at once)
        deadline = time.monotonic() + ANSWER_GRACE_S
        while dul.is_alive() and dul.state_machine.current_state != "Sta1":
            if time.monotonic() >= deadline:
                break
            time.sleep(0.01)


def _close_association(assoc: Any, join_s: float) -> None:
    """After the association thread ended, however it ended: the DUL thread stopped, the
    socket closed and the wake-up pipe released. pynetdicom does all of that on its own
    paths (release, abort, rejection, no request); on any other (its thread died) they
    were left for as long as the peer held the connection. EVT_CONN_CLOSE is triggered
    when the connection is closed here, so its handlers (studies cut off) run as for
    any other close."""
    dul = assoc.dul
    if dul.is_alive():
        dul.kill_dul()
        dul.join(join_s)
    wrapped = dul.socket
    raw = getattr(wrapped, "socket", None)
    # pynetdicom's state machine closes through the wrapper (which forgets the socket)
    # and triggers EVT_CONN_CLOSE; a socket still there was never closed that way (the
    # association thread died, or the DUL thread did and only the raw socket was shut)
    if raw is not None:
        with contextlib.suppress(Exception):
            wrapped.close()
        with contextlib.suppress(Exception):
            raw.close()
        address = getattr(assoc.requestor.address_info, "as_tuple", None)
        evt.trigger(assoc, evt.EVT_CONN_CLOSE, {"address": address})
    if not dul.is_alive():  # else its own end closes the pipe (never under a select)
        reactor.release(assoc)


class _Handler(RequestHandler):
    """Runs the association in this connection's thread's lifetime: returns only when the
    association has ended and its connection is closed (:func:`_close_association`), so
    the server knows when the connection is gone."""

    def _create_association(self) -> Any:
        assoc = super()._create_association()
        assoc.__class__ = _GuardedAssociation  # its thread's failure answered, not left
        sock = assoc.dul.socket
        sock.__class__ = BoundedSocket  # same state, bounded reads
        sock.pdu_timeout_s = self.server.pdu_timeout_s
        sock.max_pdu_bytes = self.server.max_pdu_bytes
        _check_conversion(assoc.dul)
        # no 1 ms polls (~2,000 wake-ups a second); the DUL thread's CPU counted
        reactor.wait_instead_of_polling(assoc, self.server.cpu_ledger)
        return assoc

    def handle(self) -> None:
        assoc = self._create_association()
        limit = self.server.limit_store(assoc) if self.server.limit_store else None
        evt.trigger(assoc, evt.EVT_CONN_OPEN, {"address": self.client_address})
        try:
            assoc.start()
            assoc.join()
        finally:
            if limit is not None:
                limit.discard()
            _close_association(assoc, self.server.pdu_timeout_s + 1.0)


def _left_without_a_byte(sock: socket.socket) -> bool:
    """Whether the peer closed or reset the connection having sent nothing, as a load
    balancer's TCP health check or a port scan does. Waits, under the socket's timeout, for
    the first byte as the TLS handshake's first read would, and leaves it to be read."""
    try:
        return not sock.recv(1, socket.MSG_PEEK)
    except ConnectionResetError:
        return True


def _plain_dicom(sock: socket.socket) -> bool:
    """Whether the connection's first byte (already there: :func:`_left_without_a_byte`
    waited for it) is an A-ASSOCIATE-RQ's PDU type (0x01) rather than a TLS handshake
    record's (0x16): a sender set up for plain DICOM on the TLS port. Left to the
    handshake it was logged as "WRONG_VERSION_NUMBER"."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == A_ASSOCIATE_RQ
    except OSError:
        return False


def _read_exactly(sock: socket.socket, size: int, deadline: float) -> bytes:
    """``size`` bytes, or fewer where the peer closed or ``deadline`` passed."""
    data = bytearray()
    while len(data) < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            sock.settimeout(remaining)
            chunk = sock.recv(min(size - len(data), 65536))
        except (TimeoutError, OSError):
            break
        if not chunk:
            break
        data.extend(chunk)
    return bytes(data)


def _ae_title(field: bytes) -> str | None:
    """An AE title field's text, or None unless it is readable: printable ASCII without
    backslash (PS3.5's AE value representation) and not blank."""
    if any(b < 0x20 or b > 0x7E or b == 0x5C for b in field):
        return None
    return field.decode("ascii").strip() or None


def refuse_plain_request(
    sock: socket.socket, *, timeout_s: float, max_pdu_bytes: int
) -> tuple[str, str | None]:
    """On the TLS port, a connection whose first byte says A-ASSOCIATE-RQ: read that one
    PDU (its announced length, at most ``max_pdu_bytes``, within ``timeout_s``) and
    nothing after it, and answer :data:`PLAIN_ON_TLS_REJECT` in the clear, so the sender
    reports a rejection rather than a dropped connection. All of the request is read
    first, so closing sends FIN after the answer, not a reset that could overtake it.

    Returns ``"answered"``, ``"gone"`` (the peer left before the answer could be sent)
    or ``"unreadable"`` (no complete request of a plausible length), and the request's
    calling AE title when readable. Nothing of the request is used but that title, for
    the log: the connection never becomes an association, and no TLS is involved (a TLS
    client never sends 0x01)."""
    deadline = time.monotonic() + timeout_s
    header = _read_exactly(sock, 6, deadline)
    if len(header) < 6 or header[:1] != A_ASSOCIATE_RQ:
        return "unreadable", None
    length = int.from_bytes(header[2:6], "big")
    if not _RQ_FIXED_BYTES <= length <= max_pdu_bytes:
        return "unreadable", None  # not a request this SCP would read on a plain port
    body = _read_exactly(sock, length, deadline)
    if len(body) < length:
        return "unreadable", None
    calling = _ae_title(body[_CALLING_AE])
    try:
        sock.settimeout(max(deadline - time.monotonic(), 1.0))
        sock.sendall(PLAIN_ON_TLS_REJECT)
    except OSError:
        return "gone", calling
    return "answered", calling


def _handshake_failure(exc: BaseException) -> str:
    """A failed handshake's reason for the log: OpenSSL's reason name, and for a client
    certificate that did not verify, why (expired, another CA, not yet valid): both used
    to read "CERTIFICATE_VERIFY_FAILED" alike."""
    reason = getattr(exc, "reason", None) or type(exc).__name__
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"{reason} (client certificate: {exc.verify_message})"
    if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":  # read as OpenSSL's name alone
        return (
            f"{reason} (the peer sent no client certificate; gateway.tls asks each peer for "
            "one its ca signed)"
        )
    return str(reason)


def answer_busy(sock: socket.socket) -> None:
    """Write :data:`BUSY_REJECT` without waiting (it fits any fresh send buffer) and read
    what the peer has already sent (its A-ASSOCIATE-RQ), so that closing the socket
    sends FIN after the rejection rather than a reset that could overtake it."""
    try:
        sock.setblocking(False)
        sock.send(BUSY_REJECT)
        for _ in range(16):  # an A-ASSOCIATE-RQ is a few KiB: bounded, never a wait
            if not sock.recv(65536):
                break
    except OSError:  # BlockingIOError (nothing more to read) included: close as before
        pass


class GatewayServer(ThreadedAssociationServer):
    """An association server whose accept loop never waits on a client."""

    # association threads end on their own (timeouts); shutdown must not wait for them
    block_on_close = False
    daemon_threads = True

    def __init__(
        self,
        *args: Any,
        admission: Admission,
        handshake_timeout_s: float,
        pdu_timeout_s: float,
        max_pdu_bytes: int,
        limit_store: Callable[[Any], StoreLimit] | None = None,
        hand_over: Callable[[socket.socket, Any], None] | None = None,
        cpu_ledger: CpuLedger | None = None,
        **kwargs: Any,
    ) -> None:
        self.admission = admission
        self.cpu_ledger = cpu_ledger
        self.limit_store = limit_store
        self.hand_over = hand_over
        self.handshake_timeout_s = handshake_timeout_s
        self.pdu_timeout_s = pdu_timeout_s
        self.max_pdu_bytes = max_pdu_bytes
        super().__init__(*args, request_handler=_Handler, **kwargs)
        self.contexts = _SharedContexts(self.contexts)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """At accept, before a thread: over-limit connections are answered
        :data:`BUSY_REJECT` (plain TCP) and closed at once."""
        if self.admission.admit(str(client_address[0])):
            return True
        if self.ssl_context is None:
            answer_busy(request)
        return False

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            if self.hand_over is None:
                super().process_request(request, client_address)
                return
            self.hand_over(request, client_address)  # the receiving process releases
            request.close()  # this process's copy; the receiving process has its own
        except Exception:  # no thread started, nothing handed over: give the slot back
            self.admission.release(str(client_address[0]))
            raise

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept only: TLS is negotiated in the connection's own thread."""
        assert self.socket is not None
        return self.socket.accept()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        host = str(client_address[0])
        try:
            if self.ssl_context is not None:
                request = self._handshake(request, host)
                if request is None:
                    return
            self.finish_request(request, client_address)  # returns when the association ends
        except Exception as exc:  # one line, never a traceback (peer-controlled input)
            logger.warning("connection from %s ended: %s", host, type(exc).__name__)
            self.shutdown_request(request)
        finally:
            self.admission.release(host)

    def _handshake(self, raw: socket.socket, host: str) -> ssl.SSLSocket | None:
        assert self.ssl_context is not None
        raw.settimeout(self.handshake_timeout_s)
        try:
            if _left_without_a_byte(raw):  # a TCP health check: no warning every few seconds
                logger.debug("connection from %s closed before the TLS handshake", host)
                self.shutdown_request(raw)
                return None
            if _plain_dicom(raw):
                self._refuse_plain(raw, host)
                return None
            tls = self.ssl_context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            logger.warning("TLS handshake with %s failed: %s", host, _handshake_failure(exc))
            self.shutdown_request(raw)
            return None
        tls.settimeout(None)  # pynetdicom polls with select, then reads blocking
        return tls

    def _refuse_plain(self, raw: socket.socket, host: str) -> None:
        """A plain DICOM sender on the TLS port: answered A-ASSOCIATE-RJ in the clear
        when its request is readable (:func:`refuse_plain_request`), one log line naming
        its address and calling AE title, and closed."""
        outcome, calling = refuse_plain_request(
            raw, timeout_s=self.handshake_timeout_s, max_pdu_bytes=self.max_pdu_bytes
        )
        if outcome == "unreadable":
            logger.warning(
                "TLS handshake with %s failed: it sent plain data beginning as a DICOM "
                "association request to this TLS-only port (gateway.tls), not a readable "
                "one: closed unanswered",
                host,
            )
        else:
            logger.warning(
                "TLS handshake with %s failed: %s sent a plain DICOM association request "
                "to this TLS-only port (gateway.tls), %s: the peer must use DICOM TLS",
                host,
                f"AE {calling!r}" if calling else "it",
                "answered A-ASSOCIATE-RJ (rejected-permanent)"
                if outcome == "answered"
                else "and left before the answer",
            )
        self.shutdown_request(raw)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.warning("connection from %s failed", client_address[0])


class HandedServer(GatewayServer):
    """A :class:`GatewayServer` that listens nowhere: a receiving process passes each
    socket handed over to :meth:`process_request` (which starts its thread)."""

    def server_bind(self) -> None:
        """No socket of its own: connections come from the parent."""

    def server_activate(self) -> None:
        """Nothing to listen on."""

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return True  # admitted by the parent at accept


def make_server(ae: Any, address: tuple[str, int], **options: Any) -> GatewayServer:
    """``AE.make_server`` with a :class:`GatewayServer` (``server_class`` may name a
    subclass; ``options``: its keyword arguments)."""
    options.setdefault("server_class", GatewayServer)
    server: GatewayServer = ae.make_server(address, **options)
    return server


def serve_in_thread(ae: Any, server: GatewayServer) -> GatewayServer:
    """Serve ``server`` (from :func:`make_server`) on a thread of its own, as
    ``AE.start_server(block=False)`` does; binding and serving are two steps so that the
    SCP can refuse an address it cannot bind before it starts anything else."""
    thread = threading.Thread(target=server.serve_forever, name="radserve-scp", daemon=True)
    thread.start()
    ae._servers.append(server)  # so AE.shutdown() stops it (as AE.start_server does)
    return server
