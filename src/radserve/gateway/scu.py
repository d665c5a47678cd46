"""C-ECHO and C-STORE to a DICOM destination, with every failure classified once.

A send's result is one of three outcomes, which the outbox turns into row states:

- ``SENT``: success or any warning status (0xB000 coercion, 0xB006, 0xB007, a vendor's
  0xBxxx, 0x0001): the peer has it;
- ``RETRY``: nothing is wrong here, try later — cannot connect, association aborted or
  rejected *transient*, status 0xA7xx (out of resources), 0x0110 processing failure;
- ``PERMANENT``: retrying cannot help until a person changes something — association
  rejected *permanent* (e.g. the PACS does not know radserve's AE title), no accepted
  presentation context for the file, other failure statuses, unreadable file.

Only the presentation contexts the files need are proposed (each file's SOP Class with
its transfer syntax; uncompressed files also offer the other little-endian syntax), so
SEG and Comprehensive 3D SR are proposed although they are rarely among defaults.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import pydicom
from pydicom.errors import InvalidDicomError
from pydicom.uid import UID
from pynetdicom import AE, build_role, evt
from pynetdicom.association import Association
from pynetdicom.events import Event
from pynetdicom.presentation import PresentationContext, build_context

from radserve.config import GatewaySettings
from radserve.gateway import commitment, conformance
from radserve.gateway.config import Destination, check_ae_title
from radserve.security.logs import REDACTED, redact
from radserve.tls import TlsConfigError, client_context

logger = logging.getLogger(__name__)

MAX_CONTEXTS = 128  # odd context IDs 1..255 (PS3.8 9.3.2.2)


class Outcome(StrEnum):
    SENT = "sent"
    RETRY = "retry"
    PERMANENT = "permanent"


@dataclass(frozen=True)
class SendResult:
    outcome: Outcome
    message: str
    status: int | None = None
    warning: bool = False  # SENT with a warning status: stored, maybe not as sent
    # RETRY: the peer asked to wait at least this long (HTTP Retry-After), seconds
    not_before_s: float | None = None


@dataclass(frozen=True)
class OutgoingFile:
    """One file to send; ``key`` identifies it to the caller (the outbox row id)."""

    key: int
    path: Path
    sop_class_uid: str
    transfer_syntax_uid: str
    sop_instance_uid: str


ResultCallback = Callable[[OutgoingFile, SendResult], None]
# asked before each file's C-STORE: False skips the file, with no result (the outbox: its
# row is no longer this sender's, radserve.gateway.lease_keeper.LeaseKeeper.still_ours)
StillOurs = Callable[[OutgoingFile], bool]


class StoreSCU:
    """Opens one association per destination and batch; thread-safe (no shared state
    beyond settings)."""

    # how long a storage commitment report may take on the N-ACTION's own association,
    # when the caller waits for one there (:meth:`request_commitment`)
    same_association_wait_s = 1.0

    def __init__(
        self,
        ae_title: str = "RADSERVE",
        *,
        connect_timeout_s: float = 10.0,
        acse_timeout_s: float = 30.0,
        dimse_timeout_s: float = 120.0,
        network_timeout_s: float = 120.0,
        connect_timeout_name: str = "gateway.connect_timeout_s",
    ) -> None:
        self.ae_title = check_ae_title(ae_title, "radserve's calling AE title")
        self._timeouts = (connect_timeout_s, acse_timeout_s, dimse_timeout_s, network_timeout_s)
        # what a message names for the connect time-out: the setting, or a command's option
        self.connect_timeout_name = connect_timeout_name

    @property
    def attempt_s(self) -> float:
        """The longest one file's C-STORE takes, an association for it included (its
        connect, A-ASSOCIATE, DIMSE and network timeouts): what an outbox lease covers."""
        return float(sum(self._timeouts))

    @classmethod
    def from_settings(cls, gateway: GatewaySettings) -> StoreSCU:
        """The outbox SCU: calls as ``gateway.ae_title`` with the gateway's timeouts."""
        return cls(
            gateway.ae_title,
            connect_timeout_s=gateway.connect_timeout_s,
            acse_timeout_s=gateway.acse_timeout_s,
            dimse_timeout_s=gateway.dimse_timeout_s,
            network_timeout_s=gateway.network_timeout_s,
        )

    def echo(self, destination: Destination) -> SendResult:
        """C-ECHO: can radserve associate with the destination, and does it answer?"""
        ae = self._ae()
        ae.add_requested_context(conformance.VERIFICATION)
        assoc, failure = self._associate(ae, destination)
        if failure is not None or assoc is None:
            return failure or SendResult(Outcome.RETRY, "no association")
        try:
            status = assoc.send_c_echo()
        finally:
            assoc.release()
        code = int(status.Status) if "Status" in status else None
        if code == conformance.Status.SUCCESS:
            return SendResult(Outcome.SENT, f"C-ECHO to {destination} succeeded", code)
        return SendResult(Outcome.RETRY, f"C-ECHO to {destination}: no success ({code})", code)

    def send(
        self,
        destination: Destination,
        files: Sequence[OutgoingFile],
        on_result: ResultCallback,
        *,
        still_ours: StillOurs | None = None,
    ) -> None:
        """C-STORE every file; ``on_result`` is called once per file, right after its
        status arrives (so the caller can record "sent" before the next file goes).
        ``still_ours``: asked right before each file's C-STORE; a file it refuses is not
        sent and gets no result."""
        for batch in _batches(files):
            self._send_batch(destination, batch, on_result, still_ours)

    def _send_batch(
        self,
        destination: Destination,
        files: Sequence[OutgoingFile],
        on_result: ResultCallback,
        still_ours: StillOurs | None = None,
    ) -> None:
        ae = self._ae()
        for context in _contexts(files):
            ae.add_requested_context(context.abstract_syntax, context.transfer_syntax)
        assoc, failure = self._associate(ae, destination)
        if failure is not None or assoc is None:
            for item in files:
                on_result(item, failure or SendResult(Outcome.RETRY, "no association"))
            return
        accepted = {
            (str(cx.abstract_syntax), str(cx.transfer_syntax[0])) for cx in assoc.accepted_contexts
        }
        try:
            remaining = list(files)
            while remaining:
                item = remaining.pop(0)
                if still_ours is not None and not still_ours(item):
                    continue  # another sender took it over: it sends it
                if not assoc.is_established:
                    # the peer ended it after the previous file's answer, while that was
                    # recorded or this row read back: before, pynetdicom's RuntimeError
                    # left this file and the rest an "internal error" with a traceback
                    ended = SendResult(
                        Outcome.RETRY,
                        f"not sent: {destination} ended the association after the previous "
                        "file's answer, before this file's C-STORE (an A-ABORT or a closed "
                        "connection)",
                    )
                    for other in (item, *remaining):
                        on_result(other, ended)
                    return
                result = self._store_one(assoc, destination, item, accepted)
                on_result(item, result)
                if not assoc.is_established:
                    # the rest of the batch was not offered: say why the association ended
                    # (before session 36 only the first row did; the others read "lost")
                    lost = SendResult(
                        Outcome.RETRY,
                        f"not sent: the association with {destination} ended at an earlier "
                        f"file of this batch ({result.message})",
                    )
                    for other in remaining:
                        on_result(other, lost)
                    return
        finally:
            if assoc.is_established:
                assoc.release()

    def _store_one(
        self,
        assoc: Association,
        destination: Destination,
        item: OutgoingFile,
        accepted: set[tuple[str, str]],
    ) -> SendResult:
        if not _has_context(item, accepted):
            name = UID(item.sop_class_uid).name
            syntax = UID(item.transfer_syntax_uid).name
            return SendResult(
                Outcome.PERMANENT,
                f"{destination} accepted no presentation context for {name} in {syntax}: "
                "enable this SOP class at the destination",
            )
        started = time.monotonic()
        try:
            status = assoc.send_c_store(str(item.path))
        except (OSError, ValueError, AttributeError) as exc:
            return SendResult(Outcome.PERMANENT, f"cannot send {item.path.name}: {exc}")
        except RuntimeError:
            if assoc.is_established:
                raise
            # ended between the caller's look and the request (pynetdicom refuses to send)
            return SendResult(
                Outcome.RETRY,
                f"not sent: {destination} ended the association before this file's C-STORE "
                "(an A-ABORT or a closed connection)",
            )
        if "Status" not in status:
            waited = time.monotonic() - started
            return SendResult(Outcome.RETRY, self._no_response(destination, waited))
        code = int(status.Status)
        comment = peer_comment(str(status.get("ErrorComment", "") or ""), item.path)
        text = f"C-STORE status 0x{code:04X} ({status_meaning(code)}) from {destination}" + (
            f": {comment}" if comment else ""
        )
        if conformance.is_success(code):
            return SendResult(Outcome.SENT, text, code, warning=code != conformance.Status.SUCCESS)
        if conformance.is_retryable_status(code):
            return SendResult(Outcome.RETRY, text, code)
        return SendResult(Outcome.PERMANENT, text, code)

    def _no_response(self, destination: Destination, waited: float) -> str:
        """Why a C-STORE got no status after ``waited`` s: the peer ended the association
        (an A-ABORT or a dropped connection) before the DIMSE timeout, or it did not
        answer within it (pynetdicom then aborts). Told apart by the time waited: which
        side aborted is not reliably known to pynetdicom's caller once it returns."""
        if waited < self._timeouts[2]:
            return (
                f"{destination} aborted the association instead of answering the C-STORE "
                f"(a PACS may do so when it refuses radserve's calling AE title "
                f"{self.ae_title!r}, its address or the SOP class: check the destination's "
                "configuration)"
            )
        return (
            f"no C-STORE response from {destination} within {self._timeouts[2]:g} s "
            "(gateway.dimse_timeout_s); radserve aborted the association"
        )

    def request_commitment(
        self,
        destination: Destination,
        transaction_uid: str,
        files: Sequence[OutgoingFile],
        on_report: commitment.ReportHandler,
        *,
        wait_for_report: bool = True,
    ) -> SendResult:
        """N-ACTION: ask ``destination`` to commit ``files`` under ``transaction_uid``.
        ``SENT``: the request was accepted (the report comes later). The SCU/SCP role is
        proposed, so a peer may report on this association (Orthanc 1.10.1 accepts the
        role and never does); a report that does goes to ``on_report``. With
        ``wait_for_report`` the association is kept up to :attr:`same_association_wait_s`
        after the N-ACTION's success, ending as soon as a report arrives; without, it is
        released at once (a peer known to report on an association of its own)."""
        reported = threading.Event()

        def on_event_report(event: Event) -> tuple[int, None]:
            calling = str(event.assoc.acceptor.ae_title).strip()
            status, _comment = commitment.answer(calling, event.event_information, on_report)
            reported.set()
            return status, None

        ae = self._ae()
        ae.add_requested_context(commitment.PUSH_MODEL)
        role = build_role(commitment.PUSH_MODEL, scu_role=True, scp_role=True)
        assoc, failure = self._associate(
            ae,
            destination,
            ext_neg=[role],
            handlers=[(evt.EVT_N_EVENT_REPORT, on_event_report)],
        )
        if failure is not None or assoc is None:
            return failure or SendResult(Outcome.RETRY, "no association")
        try:
            if not any(cx.as_scu for cx in assoc.accepted_contexts):
                return SendResult(
                    Outcome.PERMANENT,
                    f"{destination} does not accept Storage Commitment Push Model: enable it "
                    "there or turn storage_commitment off for this peer",
                )
            request = commitment.action_dataset(
                transaction_uid, [(f.sop_class_uid, f.sop_instance_uid) for f in files]
            )
            status, _reply = assoc.send_n_action(
                request,
                commitment.REQUEST_COMMITMENT,
                commitment.PUSH_MODEL,
                commitment.PUSH_MODEL_INSTANCE,
            )
            code = int(status.Status) if "Status" in status else None
            if code is None:
                return SendResult(Outcome.RETRY, f"no N-ACTION response from {destination}")
            if code != conformance.Status.SUCCESS:
                return SendResult(
                    Outcome.RETRY, f"N-ACTION status 0x{code:04X} from {destination}", code
                )
            if wait_for_report:
                reported.wait(self.same_association_wait_s)
            return SendResult(Outcome.SENT, f"storage commitment requested from {destination}")
        finally:
            if assoc.is_established:
                assoc.release()

    def _ae(self) -> AE:
        ae = AE(ae_title=self.ae_title)
        connect, acse, dimse, network = self._timeouts
        ae.connection_timeout = connect
        ae.acse_timeout = acse
        ae.dimse_timeout = dimse
        ae.network_timeout = network
        return ae

    def _associate(
        self,
        ae: AE,
        destination: Destination,
        *,
        ext_neg: list[Any] | None = None,
        handlers: list[Any] | None = None,
    ) -> tuple[Association | None, SendResult | None]:
        opened = threading.Event()
        negotiated = threading.Event()  # the peer answered A-ASSOCIATE-AC
        tls_args = None
        tls_errors: list[OSError] = []
        if destination.tls is not None:
            try:
                context = client_context(destination.tls, f"destination {destination.name}")
            except TlsConfigError as exc:
                return None, SendResult(Outcome.PERMANENT, exc.message)
            context.sslsocket_class = _recording_socket_class(tls_errors)
            # the peer's certificate must name the host radserve connects to
            tls_args = (context, destination.host)
        started = time.monotonic()
        try:
            assoc = ae.associate(
                destination.host,
                destination.port,
                ae_title=destination.ae_title,
                tls_args=tls_args,
                ext_neg=ext_neg,
                evt_handlers=[
                    (evt.EVT_CONN_OPEN, lambda _event: opened.set()),
                    (evt.EVT_ACCEPTED, lambda _event: negotiated.set()),
                    *(handlers or []),
                ],
            )
        except OSError as exc:  # pynetdicom resolves the address before it connects
            return None, SendResult(Outcome.RETRY, _unresolved(destination, exc))
        if assoc.is_established:
            return assoc, None
        if negotiated.is_set() and not assoc.accepted_contexts:
            return assoc, SendResult(Outcome.PERMANENT, _nothing_accepted(assoc, destination))
        if tls_errors and not assoc.is_rejected:
            return assoc, SendResult(
                Outcome.RETRY,
                _tls_failure(
                    destination, tls_errors[0], self._timeouts[0], self.connect_timeout_name
                ),
            )
        failure = _association_failure(assoc, destination, self.ae_title, opened.is_set())
        acse = self._timeouts[1]
        if failure.message.endswith(UNANSWERED) and time.monotonic() - started >= acse:
            failure = SendResult(
                Outcome.RETRY,
                f"no answer to the association request from {destination} within {acse:g} s "
                "(gateway.acse_timeout_s; raise it for a PACS that is slow to accept)",
            )
        return assoc, failure


# C-STORE response statuses in words (PS3.4 B.2.3, PS3.7 C): (low, high, meaning)
_STATUS_MEANINGS = (
    (0x0000, 0x0000, "success"),
    (0x0001, 0x0001, "warning: optional attributes not supported, stored"),
    (0x0107, 0x0107, "warning: attribute list error, stored"),
    (0x0116, 0x0116, "warning: attribute value out of range, stored"),
    (0xB000, 0xB000, "warning: elements coerced, stored"),
    (0xB006, 0xB006, "warning: elements discarded, stored"),
    (0xB007, 0xB007, "warning: data set does not match the SOP class, stored"),
    (0xB000, 0xBFFF, "warning: stored"),
    (0x0110, 0x0110, "processing failure at the destination"),
    (0x0122, 0x0122, "SOP class not supported by the destination"),
    (0x0124, 0x0124, "refused: radserve not authorized"),
    (0x0210, 0x0210, "duplicate invocation"),
    (0x0211, 0x0211, "unrecognized operation"),
    (0x0212, 0x0212, "mistyped argument"),
    (0x0213, 0x0213, "resource limitation at the destination"),
    (0xA700, 0xA7FF, "refused: out of resources"),
    (0xA900, 0xA9FF, "error: data set does not match the SOP class"),
    (0xC000, 0xCFFF, "error: cannot understand"),
    (0xFE00, 0xFE00, "cancelled, though radserve cancelled nothing"),
    (0xFF00, 0xFF01, "pending, which is no final answer to a C-STORE"),
)


def status_meaning(code: int) -> str:
    """What a C-STORE response status means, in words: a row's reason and the log name
    it, not the bare code. Before, a failure read "C-STORE status 0xC123 from PACS", and
    a status DICOM does not define (a PACS's own) looked like any other."""
    for low, high, meaning in _STATUS_MEANINGS:
        if low <= code <= high:
            return meaning
    return "a status DICOM does not define for C-STORE"


# Values of the sent file that a PACS may quote in its Error Comment ("Patient ID X does
# not match ..."): removed before the comment is logged or stored
_PATIENT_KEYWORDS = ("PatientName", "PatientID", "PatientBirthDate", "IssuerOfPatientID")


def peer_comment(comment: str, path: Path) -> str:
    """The peer's Error Comment as radserve may log and store it: the comment is the
    peer's free text, so the sent file's patient name (and each of its components), ID
    and birth date are cut out, then whatever else looks like a value (quoted text, dates,
    digit runs: :func:`radserve.security.logs.redact`), as for third-party log lines."""
    if not comment:
        return comment
    try:
        header = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=_PATIENT_KEYWORDS)
    except (OSError, InvalidDicomError):
        header = pydicom.Dataset()
    values: set[str] = set()
    for keyword in _PATIENT_KEYWORDS:
        value = str(header.get(keyword, "") or "").strip()
        values.add(value)
        values.update(re.split(r"[\^=\s]+", value) if keyword == "PatientName" else ())
    for value in sorted((v for v in values if len(v) > 1), key=len, reverse=True):
        comment = re.sub(re.escape(value), REDACTED, comment, flags=re.IGNORECASE)
    return redact(comment)


UNANSWERED = "aborted or timed out"


def _association_failure(
    assoc: Association, destination: Destination, calling: str, connected: bool
) -> SendResult:
    if assoc.is_rejected:
        primitive = assoc.acceptor.primitive
        result = int(getattr(primitive, "result", 0) or 0)
        source = int(getattr(primitive, "result_source", 0) or 0)
        diagnostic = int(getattr(primitive, "diagnostic", 0) or 0)
        reason = conformance.REJECT_REASONS.get((source, diagnostic), f"reason {diagnostic}")
        if result == conformance.REJECTED_TRANSIENT:
            return SendResult(
                Outcome.RETRY, f"{destination} rejected the association for now: {reason}"
            )
        hint = "check the destination's AE configuration"
        if (source, diagnostic) == (1, 1) and destination.tls is None:
            # a TLS-only port answers a plain request so (radserve's own: gateway.tls); the
            # hint named the AE configuration alone, which then looked right
            hint += (
                ", or whether its port takes DICOM TLS only: then set its tls "
                "(`radserve gateway echo`: --tls-ca)"
            )
        return SendResult(
            Outcome.PERMANENT,
            f"{destination} rejected the association permanently: {reason} "
            f"(radserve calls as {calling!r}; {hint})",
        )
    if not connected:
        return SendResult(
            Outcome.RETRY,
            f"cannot connect to {destination}",
        )
    return SendResult(Outcome.RETRY, f"association with {destination} {UNANSWERED}")


def _recording_socket_class(errors: list[OSError]) -> type[ssl.SSLSocket]:
    """An :class:`ssl.SSLSocket` class that appends to ``errors`` what fails its TLS
    handshake, or a TLS alert the peer sends after it (a TLS 1.3 server refuses the
    client's certificate after the client's handshake has ended): pynetdicom logs
    these and reports only that the connection or the association failed."""

    class RecordingSocket(ssl.SSLSocket):
        def do_handshake(self, block: bool = False) -> None:
            try:
                super().do_handshake(block)
            except OSError as exc:
                errors.append(exc)
                raise

        def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
            try:
                return super().recv(buflen, flags)
            except ssl.SSLError as exc:
                if "ALERT" in str(exc.reason):  # the peer's word, not a closed stream
                    errors.append(exc)
                raise

    return RecordingSocket


# what the peer's TLS alerts mean for the operator (OpenSSL's reason names)
_PEER_REFUSED_OUR_CERTIFICATE = (
    "CERTIFICATE_REQUIRED",
    "BAD_CERTIFICATE",
    "UNKNOWN_CA",
    "CERTIFICATE_EXPIRED",
    "CERTIFICATE_UNKNOWN",
    "UNSUPPORTED_CERTIFICATE",
    "ACCESS_DENIED",
)


# what a handshake with a port that answers in plain DICOM (or closes) ends with
_NOT_TLS = ("WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING", "RECORD_LAYER_FAILURE")


def _tls_failure(
    destination: Destination,
    exc: OSError,
    connect_s: float,
    connect_name: str = "gateway.connect_timeout_s",
) -> str:
    """Why TLS with ``destination`` failed, in the words an operator acts on: radserve
    could not verify the PACS's certificate (and why: expired, another CA, a host name it
    does not name), the PACS refused radserve's, the port does not speak TLS, or no
    answer. Before session 37 each of these read "cannot connect to HOST:PORT" (or
    "aborted or timed out"), which sends one looking at the network instead of the
    certificates. Retried all the same (a certificate may be renewed meanwhile)."""
    where = f"TLS with {destination}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or exc.reason or str(exc)
        return (
            f"{where} failed: radserve cannot verify the destination's certificate "
            f"({why}): check gateway.tls.ca and that the certificate names "
            f"{destination.host!r}"
        )
    if isinstance(exc, ssl.SSLError):
        reason = str(exc.reason or exc)
        if any(reason.endswith(alert) for alert in _PEER_REFUSED_OUR_CERTIFICATE):
            return (
                f"{where} failed: the destination refused radserve's client certificate "
                f"({reason}): check gateway.tls.cert and that the destination trusts its CA"
            )
        # a plain port closes on the hello: abruptly (UNEXPECTED_EOF) or, depending on
        # when its close lands, cleanly (SSLZeroReturnError: "connection has been closed
        # (EOF)"), which read as a bare OpenSSL message
        if isinstance(exc, ssl.SSLZeroReturnError) or reason in (
            "WRONG_VERSION_NUMBER",
            "UNEXPECTED_EOF_WHILE_READING",
            "RECORD_LAYER_FAILURE",
        ):
            return (
                f"{where} failed ({reason}): the destination's port does not answer in TLS; "
                "check that it expects DICOM TLS there, or set tls: false for this peer"
            )
        return f"{where} failed: {reason}"
    if isinstance(exc, TimeoutError):
        return (
            f"{where} failed: the destination accepted the connection but did not answer "
            f"the TLS handshake within {connect_s:g} s ({connect_name}): it is "
            "hung, or does not speak TLS on this port"
        )
    return f"{where} failed: the connection ended during the handshake ({exc.strerror or exc})"


def _unresolved(destination: Destination, exc: OSError) -> str:
    """Why no connection was tried: the host name does not resolve (DNS down, a typo, a
    PACS renamed) or is no address; retried, as a DNS outage passes. Before session 31
    this was a traceback (``gateway echo``) or an outbox "internal error"."""
    why = exc.strerror or str(exc)
    if isinstance(exc, socket.gaierror):
        return (
            f"cannot resolve {destination.host!r} ({why}): check the destination's host "
            "name and this host's DNS"
        )
    return f"cannot connect to {destination}: {why}"


def _nothing_accepted(assoc: Association, destination: Destination) -> str:
    """Why a destination that accepted the association took none of its presentation
    contexts (pynetdicom then aborts it): each context radserve proposed and the peer's
    result for it. A configuration matter at the destination, as a refused SOP class is
    for one file (:meth:`StoreSCU._store_one`): retrying cannot help."""
    proposed = {cx.context_id: cx.transfer_syntax for cx in assoc.requestor.requested_contexts}
    phrases = []
    for cx in assoc.rejected_contexts:
        syntaxes = ", ".join(UID(s).name for s in proposed.get(cx.context_id, cx.transfer_syntax))
        result = "refused" if cx.result == 0x01 else conformance.CONTEXT_RESULTS.get(cx.result)
        phrases.append(f"{UID(cx.abstract_syntax).name} in {syntaxes}: {result or hex(cx.result)}")
    return (
        f"{destination} accepted the association but none of the presentation contexts "
        f"radserve proposed ({'; '.join(sorted(set(phrases)))}): configure the destination "
        "to accept these SOP classes in one of these transfer syntaxes"
    )


def _has_context(item: OutgoingFile, accepted: set[tuple[str, str]]) -> bool:
    if (item.sop_class_uid, item.transfer_syntax_uid) in accepted:
        return True
    if item.transfer_syntax_uid in conformance.UNCOMPRESSED:  # pynetdicom re-encodes these
        return any(
            (item.sop_class_uid, str(syntax)) in accepted for syntax in conformance.UNCOMPRESSED
        )
    return False


def _context_key(item: OutgoingFile) -> tuple[str, str]:
    """Files sharing a key share a context: compressed syntaxes each get their own (an
    acceptor picks one syntax per context), uncompressed ones share one."""
    uncompressed = item.transfer_syntax_uid in conformance.UNCOMPRESSED
    return item.sop_class_uid, "uncompressed" if uncompressed else item.transfer_syntax_uid


def _contexts(files: Sequence[OutgoingFile]) -> list[PresentationContext]:
    """The contexts these files need, each file's own syntax first."""
    contexts: dict[tuple[str, str], list[str]] = {}
    for item in files:
        syntaxes = contexts.setdefault(_context_key(item), [item.transfer_syntax_uid])
        if item.transfer_syntax_uid in conformance.UNCOMPRESSED:
            syntaxes.extend(str(s) for s in conformance.UNCOMPRESSED if str(s) not in syntaxes)
    return [build_context(sop_class, ts) for (sop_class, _), ts in contexts.items()]


def _batches(files: Sequence[OutgoingFile]) -> Iterator[list[OutgoingFile]]:
    """Split so no association needs more than :data:`MAX_CONTEXTS` contexts."""
    batch: list[OutgoingFile] = []
    keys: set[tuple[str, str]] = set()
    for item in files:
        key = _context_key(item)
        if key not in keys and len(keys) == MAX_CONTEXTS:
            yield batch
            batch, keys = [], set()
        batch.append(item)
        keys.add(key)
    if batch:
        yield batch
